package kvgov.offload_test

import rego.v1

import data.kvgov.fixtures
import data.kvgov.offload

test_internal_to_host_is_allowed if {
	offload.decision.allow with input as {"scope": fixtures.scope, "tier": "host"}
}

test_internal_to_disk_is_denied if {
	d := offload.decision with input as {"scope": fixtures.scope, "tier": "disk"}
	not d.allow
	d.reason == "tier disk is not allowed for internal data"
}

test_public_to_disk_is_allowed if {
	offload.decision.allow with input as {"scope": fixtures.public_scope, "tier": "disk"}
}

test_only_public_reaches_the_shared_redis_tier if {
	offload.decision.allow with input as {"scope": fixtures.public_scope, "tier": "redis"}
	d := offload.decision with input as {"scope": fixtures.scope, "tier": "redis"}
	not d.allow
	d.reason == "tier redis is not allowed for internal data"
}

test_the_old_cpu_name_is_no_tier if {
	not offload.decision.allow with input as {"scope": fixtures.public_scope, "tier": "cpu"}
}

test_restricted_is_never_offloaded if {
	d := offload.decision with input as {"scope": fixtures.restricted_scope, "tier": "host"}
		with data.kvgov.config.offload_tiers.restricted as ["host"]
	not d.allow
	d.reason == "restricted data is never offloaded"
}

test_tenant_offload_disabled if {
	not offload.decision.allow with input as {"scope": fixtures.scope, "tier": "host"}
		with data.kvgov.config.tenants as {"acme": {"offload": false}}
}

test_missing_tier_is_denied if {
	not offload.decision.allow with input as {"scope": fixtures.scope}
	not offload.decision.allow with input as {"scope": fixtures.scope, "tier": ""}
}

test_invalid_scope_is_denied if {
	not offload.decision.allow with input as {"scope": object.remove(fixtures.scope, ["tenant"]), "tier": "host"}
}

test_unknown_classification_is_denied if {
	not offload.decision.allow with input as {"scope": object.union(fixtures.scope, {"classification": "secret"}), "tier": "host"}
		with data.kvgov.config.offload_tiers.secret as ["host"]
}

# decision's allowed body repeats deny's checks in place (the hot path): it must
# allow exactly when deny is empty, and otherwise give deny's reasons (checked
# here on a few inputs; tests/policy/test_rego.py checks generated ones).
test_allowed_exactly_when_nothing_is_denied if {
	requests := [
		{"scope": fixtures.scope, "tier": "host"},
		{"scope": fixtures.scope, "tier": "disk"},
		{"scope": fixtures.restricted_scope, "tier": "host"},
		{"scope": fixtures.scope, "tier": 7},
		{"scope": object.remove(fixtures.scope, ["tenant"]), "tier": "host"},
		{},
	]
	every tenants in [{}, {"acme": {"offload": false}}] {
		every r in requests {
			d := offload.decision with input as r with data.kvgov.config.tenants as tenants
			reasons := offload.deny with input as r with data.kvgov.config.tenants as tenants
			d.allow == (count(reasons) == 0)
			d.allow != (d.reason == concat("; ", sort(reasons)))
		}
	}
}
