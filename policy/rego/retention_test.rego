package kvgov.retention_test

import rego.v1

import data.kvgov.fixtures
import data.kvgov.retention

with_class(c) := {"scope": object.union(fixtures.scope, {"classification": c})}

test_defaults_per_classification if {
	retention.decision.ttl_seconds == 86400 with input as with_class("public")
	retention.decision.ttl_seconds == 3600 with input as with_class("internal")
	retention.decision.ttl_seconds == 600 with input as with_class("confidential")
	retention.decision.ttl_seconds == 0 with input as with_class("restricted")
}

test_restricted_is_zero_whatever_data_says if {
	retention.decision.ttl_seconds == 0 with input as with_class("restricted")
		with data.kvgov.config.retention_seconds.restricted as 3600
		with data.kvgov.config.tenants as {"acme": {"retention_seconds": {"restricted": 60}}}
}

test_tenant_override_wins if {
	retention.decision.ttl_seconds == 60 with input as with_class("internal")
		with data.kvgov.config.tenants as {"acme": {"retention_seconds": {"internal": 60}}}
}

test_tenant_override_for_other_class_is_ignored if {
	retention.decision.ttl_seconds == 3600 with input as with_class("internal")
		with data.kvgov.config.tenants as {"acme": {"retention_seconds": {"public": 60}}}
}

test_invalid_scope_gets_zero if {
	retention.decision.ttl_seconds == 0 with input as {"scope": object.remove(fixtures.scope, ["model"])}
	retention.decision.ttl_seconds == 0 with input as {}
}

test_unknown_classification_gets_zero if {
	d := retention.decision with input as with_class("secret")
	d.ttl_seconds == 0
	d.reason == "unknown classification secret"
}

test_unconfigured_classification_gets_zero if {
	retention.decision.ttl_seconds == 0 with input as with_class("internal")
		with data.kvgov.config.retention_seconds as {"public": 10}
}

test_negative_retention_is_zero if {
	retention.decision.ttl_seconds == 0 with input as with_class("internal")
		with data.kvgov.config.retention_seconds.internal as -5
}

test_non_number_retention_is_zero if {
	retention.decision.ttl_seconds == 0 with input as with_class("internal")
		with data.kvgov.config.retention_seconds.internal as "forever"
}
