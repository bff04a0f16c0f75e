package kvgov.scope_test

import rego.v1

import data.kvgov.fixtures
import data.kvgov.scope

test_complete_scope_is_valid if {
	scope.valid(fixtures.scope)
	not scope.invalid(fixtures.scope)
}

test_adapter_with_revision_is_valid if {
	scope.valid(object.union(fixtures.scope, {"adapter": "lora-a", "adapter_revision": "a1"}))
}

test_every_missing_field_is_invalid if {
	every f in array.concat(scope.string_fields, scope.nullable_fields) {
		not scope.valid(object.remove(fixtures.scope, [f]))
		f in scope.missing(object.remove(fixtures.scope, [f]))
	}
}

test_empty_string_field_is_invalid if {
	not scope.valid(object.union(fixtures.scope, {"model": ""}))
}

test_non_string_field_is_invalid if {
	not scope.valid(object.union(fixtures.scope, {"tenant": 7}))
}

test_null_required_field_is_invalid if {
	not scope.valid(object.union(fixtures.scope, {"tokenizer_revision": null}))
}

test_adapter_without_revision_is_invalid if {
	scope.invalid(object.union(fixtures.scope, {"adapter": "lora-a"})) == "adapter_revision is required when adapter is set"
}

test_revision_without_adapter_is_invalid if {
	not scope.valid(object.union(fixtures.scope, {"adapter_revision": "a1"}))
}

test_unknown_classification_is_invalid if {
	scope.invalid(object.union(fixtures.scope, {"classification": "secret"})) == "unknown classification secret"
}

test_classification_known_through_data if {
	scope.valid(object.union(fixtures.scope, {"classification": "secret"})) with data.kvgov.config.classifications as ["secret"]
}

test_non_object_is_invalid if {
	scope.invalid("acme") == "scope must be an object"
	not scope.valid(null)
}

test_missing_fields_are_listed_sorted if {
	s := object.remove(fixtures.scope, ["model", "adapter"])
	scope.invalid(s) == "scope field(s) missing or malformed: adapter, model"
}

test_tenant_config_defaults_to_empty if {
	scope.tenant_config("acme") == {}
}

test_tenant_config_reads_overrides if {
	scope.tenant_config("acme") == {"priority": 10} with data.kvgov.config.tenants as {"acme": {"priority": 10}}
}
