package kvgov.sharing_test

import rego.v1

import data.kvgov.fixtures
import data.kvgov.sharing

globex(s) := object.union(s, {"tenant": "globex"})

test_same_tenant_is_allowed if {
	sharing.decision == {"allow": true, "reason": "same tenant"} with input as {"requester": fixtures.scope, "owner": fixtures.scope}
}

test_cross_tenant_denied_by_default if {
	d := sharing.decision with input as {"requester": globex(fixtures.scope), "owner": fixtures.scope}
	not d.allow
	contains(d.reason, "never allowed above public")
}

test_cross_tenant_public_denied_without_group if {
	d := sharing.decision with input as {"requester": globex(fixtures.public_scope), "owner": fixtures.public_scope}
	not d.allow
	d.reason == "no share group lets tenant globex reuse tenant acme's public blocks"
}

test_cross_tenant_public_allowed_by_group if {
	d := sharing.decision with input as {"requester": globex(fixtures.public_scope), "owner": fixtures.public_scope}
		with data.kvgov.config.share_groups as fixtures.docs_group
	d.allow
	d.reason == "share group(s) docs grant reuse"
}

test_group_is_directional if {
	not sharing.decision.allow with input as {"requester": fixtures.public_scope, "owner": globex(fixtures.public_scope)}
		with data.kvgov.config.share_groups as fixtures.docs_group
}

test_group_cannot_grant_above_public if {
	every c in ["internal", "confidential", "restricted"] {
		s := object.union(fixtures.scope, {"classification": c})
		d := sharing.decision with input as {"requester": globex(s), "owner": s}
			with data.kvgov.config.share_groups as {"all": {"publishers": ["acme"], "readers": ["globex"], "classifications": [c]}}
		not d.allow
	}
}

test_group_without_classification_grants_nothing if {
	not sharing.decision.allow with input as {"requester": globex(fixtures.public_scope), "owner": fixtures.public_scope}
		with data.kvgov.config.share_groups as {"g": {"publishers": ["acme"], "readers": ["globex"], "classifications": []}}
}

test_model_mismatch_is_denied if {
	d := sharing.decision with input as {"requester": object.union(fixtures.scope, {"model_revision": "r2"}), "owner": fixtures.scope}
	not d.allow
	d.reason == "scopes differ in model_revision"
}

test_classification_mismatch_is_denied if {
	not sharing.decision.allow with input as {"requester": fixtures.public_scope, "owner": fixtures.scope}
}

test_invalid_requester_is_denied if {
	d := sharing.decision with input as {"requester": object.remove(fixtures.scope, ["tenant"]), "owner": fixtures.scope}
	not d.allow
	startswith(d.reason, "requester: scope field(s) missing")
}

test_missing_owner_is_denied if {
	not sharing.decision.allow with input as {"requester": fixtures.scope}
}

test_groups_default_to_own_namespace if {
	sharing.groups == {"publish": null, "read": []} with input as {"scope": fixtures.public_scope}
}

test_publisher_publishes_and_reads_its_group if {
	sharing.groups == {"publish": "docs", "read": ["docs"]} with input as {"scope": fixtures.public_scope}
		with data.kvgov.config.share_groups as fixtures.docs_group
}

test_reader_reads_but_does_not_publish if {
	sharing.groups == {"publish": null, "read": ["docs"]} with input as {"scope": globex(fixtures.public_scope)}
		with data.kvgov.config.share_groups as fixtures.docs_group
}

test_groups_only_for_public if {
	sharing.groups == {"publish": null, "read": []} with input as {"scope": fixtures.scope}
		with data.kvgov.config.share_groups as {"g": {"publishers": ["acme"], "readers": [], "classifications": ["internal"]}}
}

test_publish_picks_first_group_by_name if {
	groups := {
		"b": {"publishers": ["acme"], "classifications": ["public"]},
		"a": {"publishers": ["acme"], "classifications": ["public"]},
	}
	sharing.groups == {"publish": "a", "read": ["a", "b"]} with input as {"scope": fixtures.public_scope}
		with data.kvgov.config.share_groups as groups
}

test_groups_for_invalid_scope_are_empty if {
	sharing.groups == {"publish": null, "read": []} with input as {"scope": object.remove(fixtures.public_scope, ["model"])}
		with data.kvgov.config.share_groups as fixtures.docs_group
}

# decision's same-tenant body repeats deny's checks in place (the hot path): every
# decision must allow exactly when deny is empty, and otherwise give deny's reasons
# (checked here on a few inputs; tests/policy/test_rego.py checks generated ones).
test_allowed_exactly_when_nothing_is_denied if {
	requests := [
		{"requester": fixtures.scope, "owner": fixtures.scope},
		{"requester": globex(fixtures.public_scope), "owner": fixtures.public_scope},
		{"requester": globex(fixtures.scope), "owner": fixtures.scope},
		{"requester": object.union(fixtures.scope, {"model_revision": "r2"}), "owner": fixtures.scope},
		{"requester": object.remove(fixtures.scope, ["tenant"]), "owner": object.remove(fixtures.scope, ["tenant"])},
		{},
	]
	every groups in [{}, fixtures.docs_group] {
		every r in requests {
			d := sharing.decision with input as r with data.kvgov.config.share_groups as groups
			reasons := sharing.deny with input as r with data.kvgov.config.share_groups as groups
			d.allow == (count(reasons) == 0)
			d.allow != (d.reason == concat("; ", sort(reasons)))
		}
	}
}
