# Admission: may this scope's KV state be cached, and at what eviction priority?
#
# input:  {scope, tokens, priority}   (priority: null or an integer 0-100)
# output: decision = {allow, cache, priority, reason}
#
# Hard rules (not overridable by data): an invalid scope or unknown classification
# is denied; `restricted` is admitted but never cached (cache=false, so its blocks
# are zeroized at release); tokens must be an integer from 0 to 2^53 - 1 (the
# integers JSON numbers hold exactly: OPA and regorus disagree about rounding
# beyond them); every request is bounded by a token limit, the bundle's
# max_tokens (data.json ships 262144) unless the tenant overrides it. Tenant
# overrides (data.kvgov.config.tenants[t]): "admission": false denies, "cache":
# false admits without caching, "priority" is the tenant's default priority,
# "max_priority" caps the priority a request may ask for,
# "max_tokens" replaces the bundle's limit (a limit that is not a non-negative
# number denies every request of that tenant).
#
# Written to evaluate alike on OPA and regorus (tests/policy/test_differential.py):
# never `not` before an expression holding a nested reference (OPA rewrites
# `not n > t.max_tokens` into `x := t.max_tokens; not n > x`, which is undefined,
# not true, when max_tokens is absent: OPA issue #1877); object.get with a default
# instead; and no sprintf of an input number that is not a valid token count.
package kvgov.admission

import rego.v1

import data.kvgov.scope

scope_valid if scope.valid(input.scope)

tenant := object.get(data.kvgov.config, ["tenants", input.scope.tenant], {})

# The largest integer a JSON number holds exactly (I-JSON, RFC 7493).
max_exact_integer := 9007199254740991

valid_tokens if {
	is_number(input.tokens)
	input.tokens >= 0
	input.tokens <= max_exact_integer
	input.tokens == round(input.tokens)
}

# token_limit(t): the most tokens one request of a tenant with overrides t may
# hold: t.max_tokens where set, else the bundle's max_tokens; null when neither is.
token_limit(t) := object.get(t, "max_tokens", object.get(data.kvgov.config, "max_tokens", null))

# usable_limit(x): x is a token limit (a non-negative number).
usable_limit(x) if {
	is_number(x)
	x >= 0
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
	scope_valid
	limit := token_limit(tenant)
	not usable_limit(limit)
	msg := sprintf("max_tokens for tenant %v is not a non-negative number", [input.scope.tenant])
}

deny contains msg if {
	scope_valid
	valid_tokens
	limit := token_limit(tenant)
	usable_limit(limit)
	input.tokens > limit
	msg := sprintf("%v tokens exceed tenant %v's max_tokens %v", [input.tokens, input.scope.tenant, limit])
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
# bundle's; p itself when it is an integer 0-100, capped by the tenant's
# max_priority where set (a request hint never raises a tenant above it);
# undefined for any other p.
granted_priority(p, t) := object.get(t, "priority", data.kvgov.config.default_priority) if {
	p == null
} else := min([p, object.get(t, "max_priority", 100)]) if {
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
# is the hot path. It makes the same checks as scope_valid, valid_tokens
# (max_exact_integer written out), valid_priority, token_limit (undefined here, not
# null, when no limit is configured; 0 <= n <= limit implies limit >= 0) and the
# tenant denials, so it holds exactly when deny is empty
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
	n <= 9007199254740991
	n == round(n)
	t := object.get(data.kvgov.config, ["tenants", s.tenant], {})
	object.get(t, "admission", true) != false
	limit := object.get(t, "max_tokens", data.kvgov.config.max_tokens)
	is_number(limit)
	n <= limit
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
