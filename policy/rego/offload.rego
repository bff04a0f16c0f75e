# Offload: may this scope's KV blocks be moved to a slower tier (host memory, disk, Redis)?
#
# input:  {scope, tier}   tier: an offload tier's name, as the governor's OffloadStore
#                         names it: "host", "disk", "redis" (or a name the deployment gave)
# output: decision = {allow, reason}
#
# Hard rules: an invalid scope is denied; `restricted` is never offloaded. Otherwise
# the tier must be listed for the classification in offload_tiers, and the tenant
# must not have "offload": false.
package kvgov.offload

import rego.v1

import data.kvgov.scope

scope_valid if scope.valid(input.scope)

tenant := object.get(data.kvgov.config, ["tenants", input.scope.tenant], {})

valid_tier if scope.non_empty_string(input.tier)

allowed_tiers := object.get(data.kvgov.config, ["offload_tiers", input.scope.classification], [])

deny contains msg if {
	not scope_valid
	msg := scope.invalid(object.get(input, "scope", null))
}

deny contains "tier must be a non-empty string" if not valid_tier

deny contains "restricted data is never offloaded" if input.scope.classification == "restricted"

deny contains msg if {
	tenant.offload == false
	msg := sprintf("offload disabled for tenant %v", [input.scope.tenant])
}

# Only for a valid scope (an invalid one is denied above): the reason names the
# label, and sprintf writes a number differently on OPA and regorus.
deny contains msg if {
	scope_valid
	valid_tier
	input.scope.classification != "restricted"
	not input.tier in allowed_tiers
	msg := sprintf("tier %v is not allowed for %v data", [input.tier, input.scope.classification])
}

default decision := {"allow": false, "reason": "offload input not understood (fail closed)"}

# The allowed case first, in one body that reads the request in place: every rule
# or function a body refers to costs the embedded engine a few µs, so this is the
# hot path. It makes the same checks as scope_valid, valid_tier (`x > ""; x < []`
# is scope.non_empty_string(x), see scope.valid) and the denials, so it holds
# exactly when deny is empty (offload_test.rego checks that); otherwise deny gives
# the reasons.
decision := {"allow": true, "reason": sprintf("%v data may be offloaded to %v", [s.classification, tier])} if {
	s := input.scope
	scope.valid(s)
	tier := input.tier
	tier > ""
	tier < []
	s.classification != "restricted"
	t := object.get(data.kvgov.config, ["tenants", s.tenant], {})
	not t.offload == false
	tier in object.get(data.kvgov.config, ["offload_tiers", s.classification], [])
} else := {"allow": false, "reason": concat("; ", sort(deny))} if {
	count(deny) > 0
}
