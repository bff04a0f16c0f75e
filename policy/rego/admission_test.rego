package kvgov.admission_test

import rego.v1

import data.kvgov.admission
import data.kvgov.fixtures

request := {"scope": fixtures.scope, "tokens": 128, "priority": null}

test_internal_scope_is_admitted_and_cached if {
	admission.decision == {"allow": true, "cache": true, "priority": 50, "reason": "admitted"} with input as request
}

test_restricted_is_admitted_but_never_cached if {
	d := admission.decision with input as object.union(request, {"scope": fixtures.restricted_scope})
	d.allow
	d.cache == false
}

test_restricted_not_cached_even_if_tenant_asks if {
	d := admission.decision with input as object.union(request, {"scope": fixtures.restricted_scope})
		with data.kvgov.config.tenants as {"acme": {"cache": true}}
	d.cache == false
}

test_unknown_classification_is_denied if {
	d := admission.decision with input as object.union(request, {"scope": object.union(fixtures.scope, {"classification": "secret"})})
	not d.allow
	not d.cache
	contains(d.reason, "unknown classification secret")
}

test_every_missing_scope_field_is_denied if {
	every f in object.keys(fixtures.scope) {
		d := admission.decision with input as {"scope": object.remove(fixtures.scope, [f]), "tokens": 1, "priority": null}
		d.allow == false
		d.cache == false
	}
}

test_missing_scope_is_denied if {
	not admission.decision.allow with input as {"tokens": 1, "priority": null}
}

test_empty_input_is_denied if {
	not admission.decision.allow with input as {}
}

test_negative_tokens_are_denied if {
	d := admission.decision with input as object.union(request, {"tokens": -1})
	not d.allow
	d.reason == "tokens must be a non-negative integer"
}

test_fractional_tokens_are_denied if {
	not admission.decision.allow with input as object.union(request, {"tokens": 1.5})
}

test_string_tokens_are_denied if {
	not admission.decision.allow with input as object.union(request, {"tokens": "12"})
}

test_priority_out_of_range_is_denied if {
	not admission.decision.allow with input as object.union(request, {"priority": 101})
}

test_requested_priority_is_used if {
	admission.decision.priority == 80 with input as object.union(request, {"priority": 80})
}

test_absent_priority_uses_default if {
	admission.decision.priority == 50 with input as object.remove(request, ["priority"])
}

test_tenant_default_priority if {
	admission.decision.priority == 20 with input as request
		with data.kvgov.config.tenants as {"acme": {"priority": 20}}
}

test_default_priority_from_data if {
	admission.decision.priority == 70 with input as request
		with data.kvgov.config.default_priority as 70
}

test_admission_disabled_for_tenant if {
	d := admission.decision with input as request
		with data.kvgov.config.tenants as {"acme": {"admission": false}}
	not d.allow
	d.reason == "admission disabled for tenant acme"
}

test_other_tenant_not_affected_by_override if {
	admission.decision.allow with input as request
		with data.kvgov.config.tenants as {"globex": {"admission": false}}
}

test_tenant_cache_disabled if {
	d := admission.decision with input as request
		with data.kvgov.config.tenants as {"acme": {"cache": false}}
	d.allow
	not d.cache
}

test_tenant_max_tokens if {
	not admission.decision.allow with input as object.union(request, {"tokens": 5000})
		with data.kvgov.config.tenants as {"acme": {"max_tokens": 4096}}
	admission.decision.allow with input as object.union(request, {"tokens": 4096})
		with data.kvgov.config.tenants as {"acme": {"max_tokens": 4096}}
}

# OPA issue #1877: OPA rewrote the old `not n > t.max_tokens` so that it was
# undefined for a tenant without a max_tokens override, and every such request
# failed closed; test_internal_scope_is_admitted_and_cached failed on OPA then.
test_tenant_without_overrides_is_admitted_under_the_default_limit if {
	d := admission.decision with input as request with data.kvgov.config.tenants as {}
	d.allow
}

test_default_max_tokens_bounds_every_tenant if {
	data.kvgov.config.max_tokens == 262144
	admission.decision.allow with input as object.union(request, {"tokens": 262144})
	d := admission.decision with input as object.union(request, {"tokens": 262145})
	not d.allow
	d.reason == "262145 tokens exceed tenant acme's max_tokens 262144"
}

test_tenant_max_tokens_replaces_the_default if {
	admission.decision.allow with input as object.union(request, {"tokens": 500000})
		with data.kvgov.config.tenants as {"acme": {"max_tokens": 1000000}}
	not admission.decision.allow with input as object.union(request, {"tokens": 500000})
		with data.kvgov.config.tenants as {"globex": {"max_tokens": 1000000}}
}

test_unusable_max_tokens_denies if {
	every limit in ["lots", -1, null, true, {}] {
		d := admission.decision with input as request
			with data.kvgov.config.tenants as {"acme": {"max_tokens": limit}}
		not d.allow
		d.reason == "max_tokens for tenant acme is not a non-negative number"
	}
}

test_no_limit_configured_denies if {
	d := admission.decision with input as request with data.kvgov.config.max_tokens as null
	not d.allow
	d.reason == "max_tokens for tenant acme is not a non-negative number"
}

test_tokens_beyond_exact_json_integers_are_invalid if {
	admission.decision.allow with input as object.union(request, {"tokens": 9007199254740991})
		with data.kvgov.config.max_tokens as 9007199254740991
	d := admission.decision with input as object.union(request, {"tokens": 9007199254740992})
		with data.kvgov.config.max_tokens as 9007199254740991
	not d.allow
	d.reason == "tokens must be a non-negative integer"
}

test_decision_always_has_all_fields if {
	every i in [request, {}, {"scope": "x"}] {
		d := admission.decision with input as i
		object.keys(d) == {"allow", "cache", "priority", "reason"}
	}
}

# decision's admitted body repeats deny's checks in place (the hot path): it must
# allow exactly when deny is empty, and otherwise give deny's reasons (checked
# here on a few inputs; tests/policy/test_rego.py checks generated ones).
requests := [
	request,
	object.union(request, {"priority": 100}),
	object.union(request, {"priority": 50.5}),
	object.union(request, {"tokens": 2.5}),
	object.remove(request, ["priority"]),
	object.union(request, {"scope": fixtures.restricted_scope}),
	{"scope": object.remove(fixtures.scope, ["model"]), "tokens": 1, "priority": null},
	{},
]

tenant_overrides := [
	{},
	{"acme": {"admission": false, "cache": false, "max_tokens": 64}},
	{"acme": {"max_tokens": "lots"}},
]

test_allowed_exactly_when_nothing_is_denied if {
	every tenants in tenant_overrides {
		every r in requests {
			d := admission.decision with input as r with data.kvgov.config.tenants as tenants
			reasons := admission.deny with input as r with data.kvgov.config.tenants as tenants
			d.allow == (count(reasons) == 0)
			d.allow != (d.reason == concat("; ", sort(reasons)))
		}
	}
}

test_allowed_requests_are_admitted_in_every_variant if {
	count([r |
		some r in requests
		admission.decision.allow with input as r
	]) == 4
}

test_undefined_default_priority_fails_closed if {
	config := object.remove(data.kvgov.config, ["default_priority"])
	d := admission.decision with input as request with data.kvgov.config as config
	d == {"allow": false, "cache": false, "priority": 0, "reason": "admission input not understood (fail closed)"}
}
