# Retention: how long an idle cached block of this scope may live.
#
# input:  {scope}
# output: decision = {ttl_seconds, reason}
#
# Hard rules: an invalid scope gets 0 (evict at once); `restricted` gets 0. A
# tenant's retention_seconds override for the classification wins over the
# classification default; a value that is not a non-negative number gives 0.
package kvgov.retention

import rego.v1

import data.kvgov.scope

scope_valid if scope.valid(input.scope)

tenant := object.get(data.kvgov.config, ["tenants", input.scope.tenant], {})

cls := input.scope.classification

configured := retention_of(tenant, cls)

usable if {
	is_number(configured)
	configured >= 0
}

# retention_of(t, cls): the retention configured for classification cls, the
# tenant's override t.retention_seconds[cls] first, else the bundle's.
retention_of(t, cls) := x if {
	x := t.retention_seconds[cls]
} else := data.kvgov.config.retention_seconds[cls]

default decision := {"ttl_seconds": 0, "reason": "retention input not understood (fail closed)"}

# The bodies below exclude one another, so the order of the else chain changes
# nothing but speed: the common case (a valid scope with a usable retention) comes
# first, in one body that reads the request in place (every rule or function a
# body refers to costs the embedded engine a few µs). It is the same check as
# scope_valid, cls != "restricted" and usable.
decision := {"ttl_seconds": ttl, "reason": "configured retention"} if {
	s := input.scope
	scope.valid(s)
	s.classification != "restricted"
	ttl := retention_of(object.get(data.kvgov.config, ["tenants", s.tenant], {}), s.classification)
	is_number(ttl)
	ttl >= 0
} else := {"ttl_seconds": 0, "reason": reason} if {
	not scope_valid
	reason := scope.invalid(object.get(input, "scope", null))
} else := {"ttl_seconds": 0, "reason": "restricted data is never retained"} if {
	scope_valid
	cls == "restricted"
} else := {"ttl_seconds": 0, "reason": sprintf("no usable retention configured for %v", [cls])} if {
	scope_valid
	cls != "restricted"
	not usable
}
