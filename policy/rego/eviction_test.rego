package kvgov.eviction_test

import rego.v1

import data.kvgov.admission
import data.kvgov.eviction
import data.kvgov.fixtures

test_no_quota_by_default if {
	eviction.decision == {"tenants": {}, "errors": set()}
}

test_floor_cap_and_duration_per_tenant if {
	d := eviction.decision with data.kvgov.config.tenants as {
		"bank": {"kv_floor": {"blocks": 64}, "kv_cap": {"fraction": 0.5}, "priority_duration": 3600},
		"other": {"priority": 20},
	}
	d.errors == set()
	d.tenants == {"bank": {"floor": {"blocks": 64}, "cap": {"fraction": 0.5}, "priority_duration": 3600}}
}

test_bundle_duration_applies_to_every_configured_tenant if {
	d := eviction.decision with data.kvgov.config.priority_duration as 60
		with data.kvgov.config.tenants as {"a": {}, "b": {"priority_duration": 5}}
	d.tenants.a == {"floor": null, "cap": null, "priority_duration": 60}
	d.tenants.b.priority_duration == 5
}

test_malformed_amounts_are_errors if {
	d := eviction.decision with data.kvgov.config.tenants as {
		"a": {"kv_floor": 10},
		"b": {"kv_cap": {"fraction": 1.5}},
		"c": {"kv_floor": {"blocks": -1}},
		"d": {"kv_cap": {"blocks": 2, "fraction": 0.1}},
		"e": {"priority_duration": 0},
	}
	count(d.errors) == 5
}

test_request_priority_is_capped_by_the_tenants_max_priority if {
	d := admission.decision with input as {"scope": fixtures.scope, "tokens": 10, "priority": 95}
		with data.kvgov.config.tenants as {"acme": {"max_priority": 70}}
	d.allow
	d.priority == 70
}

test_request_priority_below_the_cap_is_kept if {
	d := admission.decision with input as {"scope": fixtures.scope, "tokens": 10, "priority": 30}
		with data.kvgov.config.tenants as {"acme": {"max_priority": 70}}
	d.priority == 30
}
