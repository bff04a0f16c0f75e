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

configured := t if {
	t := tenant.retention_seconds[cls]
} else := data.kvgov.config.retention_seconds[cls]

usable if {
	is_number(configured)
	configured >= 0
}

default decision := {"ttl_seconds": 0, "reason": "retention input not understood (fail closed)"}

decision := {"ttl_seconds": 0, "reason": reason} if {
	not scope_valid
	reason := scope.invalid(object.get(input, "scope", null))
}

decision := {"ttl_seconds": 0, "reason": "restricted data is never retained"} if {
	scope_valid
	cls == "restricted"
}

decision := {"ttl_seconds": configured, "reason": "configured retention"} if {
	scope_valid
	cls != "restricted"
	usable
}

decision := {"ttl_seconds": 0, "reason": sprintf("no usable retention configured for %v", [cls])} if {
	scope_valid
	cls != "restricted"
	not usable
}
