# Admission: may this scope's KV state be cached, and at what eviction priority?
#
# input:  {scope, tokens, priority}   (priority: null or an integer 0-100)
# output: decision = {allow, cache, priority, reason}
#
# Hard rules (not overridable by data): an invalid scope or unknown classification
# is denied; `restricted` is admitted but never cached (cache=false, so its blocks
# are zeroized at release). Tenant overrides (data.kvgov.config.tenants[t]):
# "admission": false denies, "cache": false admits without caching, "priority"
# is the tenant's default priority, "max_tokens" bounds input.tokens.
package kvgov.admission

import rego.v1

import data.kvgov.scope

scope_valid if scope.valid(input.scope)

tenant := object.get(data.kvgov.config, ["tenants", input.scope.tenant], {})

valid_tokens if {
	is_number(input.tokens)
	input.tokens >= 0
	input.tokens == round(input.tokens)
}

valid_priority if {
	object.get(input, "priority", null) == null
}

valid_priority if {
	is_number(input.priority)
	input.priority >= 0
	input.priority <= 100
	input.priority == round(input.priority)
}

# deny: every reason this request is refused.
deny contains msg if {
	not scope_valid
	msg := scope.invalid(object.get(input, "scope", null))
}

deny contains "tokens must be a non-negative integer" if not valid_tokens

deny contains "priority must be null or an integer 0-100" if not valid_priority

deny contains msg if {
	tenant.admission == false
	msg := sprintf("admission disabled for tenant %v", [input.scope.tenant])
}

deny contains msg if {
	input.tokens > tenant.max_tokens
	msg := sprintf("%v tokens exceed tenant %v's max_tokens %v", [input.tokens, input.scope.tenant, tenant.max_tokens])
}

# cache: false for restricted (hard rule) or where the tenant disabled caching.
cache := false if {
	input.scope.classification == "restricted"
} else := false if {
	tenant.cache == false
} else := true

# The requested priority, else the tenant's, else the bundle default.
priority := input.priority if {
	is_number(input.priority)
} else := object.get(tenant, "priority", data.kvgov.config.default_priority)

allow_reason := "admitted; restricted data is never cached" if {
	input.scope.classification == "restricted"
} else := "admitted; caching disabled for tenant" if {
	not cache
} else := "admitted"

default decision := {
	"allow": false,
	"cache": false,
	"priority": 0,
	"reason": "admission input not understood (fail closed)",
}

decision := {
	"allow": false,
	"cache": false,
	"priority": 0,
	"reason": concat("; ", sort(deny)),
} if count(deny) > 0

# Allow needs positive evidence (a valid scope, token count and priority) and no
# deny reason.
decision := {
	"allow": true,
	"cache": cache,
	"priority": priority,
	"reason": allow_reason,
} if {
	scope_valid
	valid_tokens
	valid_priority
	count(deny) == 0
}
