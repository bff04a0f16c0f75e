# Sharing: may a requester reuse KV blocks another scope cached, and in which
# share-group namespaces are a scope's blocks keyed and looked up?
#
# decision: input {requester: scope, owner: scope} -> {allow, reason}
# groups:   input {scope} -> {publish: string | null, read: [string]}
#
# Hard rules (not overridable by data): no cross-tenant reuse unless a share group
# grants it, and never for anything above `public`, whatever data.json says. Both
# scopes must be valid and agree on every binding field (classification, model,
# adapter, tokenizer, their revisions, template version).
#
# A share group (data.kvgov.config.share_groups[name]) is
#   {"publishers": [tenant], "readers": [tenant], "classifications": [label]}:
# publishers' blocks of those classifications are keyed in the group's namespace;
# readers (and publishers) may reuse them.
package kvgov.sharing

import rego.v1

import data.kvgov.scope

# The only classification that may ever cross a tenant boundary.
shareable_classification := "public"

share_groups := object.get(data.kvgov.config, "share_groups", {})

# publishes(spec, t, c): tenant t's blocks of classification c are keyed in the group.
publishes(spec, t, c) if {
	c == shareable_classification
	t in spec.publishers
	c in spec.classifications
}

# reads(spec, t, c): tenant t may look up classification c blocks in the group.
reads(spec, t, c) if {
	c == shareable_classification
	t in object.get(spec, "readers", [])
	c in spec.classifications
}

reads(spec, t, c) if publishes(spec, t, c)

requester_valid if scope.valid(input.requester)

owner_valid if scope.valid(input.owner)

# Every binding field is equal (written out, as in decision's same-tenant body).
same_binding if {
	r := input.requester
	o := input.owner
	r.classification == o.classification
	r.model == o.model
	r.model_revision == o.model_revision
	r.adapter == o.adapter
	r.adapter_revision == o.adapter_revision
	r.tokenizer == o.tokenizer
	r.tokenizer_revision == o.tokenizer_revision
	r.template_version == o.template_version
}

cross_tenant if input.requester.tenant != input.owner.tenant

# The share groups letting the requester's tenant reuse the owner's blocks.
granting := {g |
	some g, spec in share_groups
	publishes(spec, input.owner.tenant, input.owner.classification)
	reads(spec, input.requester.tenant, input.owner.classification)
}

deny contains msg if {
	not requester_valid
	msg := sprintf("requester: %v", [scope.invalid(object.get(input, "requester", null))])
}

deny contains msg if {
	not owner_valid
	msg := sprintf("owner: %v", [scope.invalid(object.get(input, "owner", null))])
}

deny contains msg if {
	requester_valid
	owner_valid
	not same_binding
	mismatched := {f | some f in scope.binding_fields; input.requester[f] != input.owner[f]}
	msg := sprintf("scopes differ in %v", [concat(", ", sort(mismatched))])
}

# The cross-tenant denials name tenants and labels, so they are given only for
# valid scopes (an invalid one is denied above): sprintf writes a number that is
# not a valid field differently on OPA and regorus (1e-07 / 0.0000001).
deny contains msg if {
	requester_valid
	owner_valid
	cross_tenant
	input.owner.classification != shareable_classification
	msg := sprintf(
		"cross-tenant reuse is never allowed above %v (owner classification %v)",
		[shareable_classification, input.owner.classification],
	)
}

deny contains msg if {
	requester_valid
	owner_valid
	cross_tenant
	count(granting) == 0
	msg := sprintf(
		"no share group lets tenant %v reuse tenant %v's %v blocks",
		[input.requester.tenant, input.owner.tenant, input.owner.classification],
	)
}

default decision := {"allow": false, "reason": "sharing input not understood (fail closed)"}

# The bodies below exclude one another, so the order of the else chain changes
# nothing but speed. The common case comes first, in one body that reads the
# request in place (every rule or function a body refers to costs the embedded
# engine a few µs): reuse within a tenant, the same checks as requester_valid,
# owner_valid, same_binding and not cross_tenant, which leave deny empty
# (sharing_test.rego checks that every decision allows exactly when deny is empty).
# The owner agrees with the requester on all nine scope fields, so it is valid
# exactly when the requester is.
decision := {"allow": true, "reason": "same tenant"} if {
	r := input.requester
	o := input.owner
	r.tenant == o.tenant
	r.classification == o.classification
	r.model == o.model
	r.model_revision == o.model_revision
	r.adapter == o.adapter
	r.adapter_revision == o.adapter_revision
	r.tokenizer == o.tokenizer
	r.tokenizer_revision == o.tokenizer_revision
	r.template_version == o.template_version
	scope.valid(r)
} else := {"allow": false, "reason": concat("; ", sort(deny))} if {
	count(deny) > 0
} else := {"allow": true, "reason": sprintf("share group(s) %v grant reuse", [concat(", ", sort(granting))])} if {
	requester_valid
	owner_valid
	same_binding
	cross_tenant
	input.owner.classification == shareable_classification
	count(granting) > 0
	count(deny) == 0
}

scope_valid if scope.valid(input.scope)

publish_groups := sort([g |
	some g, spec in share_groups
	publishes(spec, input.scope.tenant, input.scope.classification)
])

read_groups := sort([g |
	some g, spec in share_groups
	reads(spec, input.scope.tenant, input.scope.classification)
])

# The first publishing group (by name) is the namespace; null keys in the tenant's own.
publish_group := publish_groups[0] if {
	count(publish_groups) > 0
} else := null

default groups := {"publish": null, "read": []}

# The classification test first: most scopes are not public, and it fails
# before the scope is validated.
groups := {"publish": publish_group, "read": read_groups} if {
	input.scope.classification == shareable_classification
	scope_valid
}
