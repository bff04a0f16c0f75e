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

# admitted(cls, t): the cache flag and reason of an admitted request of
# classification cls for a tenant with overrides t: never cached when restricted
# (hard rule) or where the tenant disabled caching.
admitted(cls, t) := {"cache": false, "reason": "admitted; restricted data is never cached"} if {
	cls == "restricted"
} else := {"cache": false, "reason": "admitted; caching disabled for tenant"} if {
	t.cache == false
} else := {"cache": true, "reason": "admitted"}

# granted_priority(p, t): the eviction priority of an admitted request that asked
# for p: when p is null (the common case, first), the tenant's default, else the
# bundle's; p itself when it is an integer 0-100; undefined for any other p.
granted_priority(p, t) := object.get(t, "priority", data.kvgov.config.default_priority) if {
	p == null
} else := p if {
	is_number(p)
	p >= 0
	p <= 100
	p == round(p)
}

default decision := {
	"allow": false,
	"cache": false,
	"priority": 0,
	"reason": "admission input not understood (fail closed)",
}

# The admitted case first, in one body that reads the request in place: every
# rule or function a body refers to costs the embedded engine a few µs, so this
# is the hot path. It makes the same checks as scope_valid, valid_tokens,
# valid_priority and the tenant denials, so it holds exactly when deny is empty
# (admission_test.rego checks that); otherwise deny gives the reasons.
decision := {
	"allow": true,
	"cache": a.cache,
	"priority": p,
	"reason": a.reason,
} if {
	s := input.scope
	scope.valid(s)
	n := input.tokens
	is_number(n)
	n >= 0
	n == round(n)
	t := object.get(data.kvgov.config, ["tenants", s.tenant], {})
	not t.admission == false
	not n > t.max_tokens
	p := granted_priority(object.get(input, "priority", null), t)
	a := admitted(s.classification, t)
} else := {
	"allow": false,
	"cache": false,
	"priority": 0,
	"reason": concat("; ", sort(deny)),
} if {
	count(deny) > 0
}
