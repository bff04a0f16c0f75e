# Validation of a cache scope, shared by every decision package.
#
# A scope is the object {tenant, classification, model, model_revision, adapter,
# adapter_revision, tokenizer, tokenizer_revision, template_version}. Every field
# must be present; adapter and adapter_revision may be null (no adapter), the
# others must be non-empty strings, and the classification must be known.
package kvgov.scope

import rego.v1

# Fields that must be non-empty strings.
string_fields := [
	"tenant", "classification", "model", "model_revision",
	"tokenizer", "tokenizer_revision", "template_version",
]

# Fields that must be present but may be null.
nullable_fields := ["adapter", "adapter_revision"]

# The fields that bind KV state: two scopes may share blocks only if all are equal.
binding_fields := [
	"classification", "model", "model_revision", "adapter", "adapter_revision",
	"tokenizer", "tokenizer_revision", "template_version",
]

# non_empty_string(x): x is a string other than "".
non_empty_string(x) if {
	is_string(x)
	x != ""
}

# missing(s): the names of the fields of s that are absent or malformed.
missing(s) := {f | some f in string_fields; not non_empty_string(object.get(s, f, null))} | {f |
	some f in nullable_fields
	not f in object.keys(s)
} | {f |
	some f in nullable_fields
	v := s[f]
	v != null
	not non_empty_string(v)
}

# valid(s): s is a complete, well-formed scope with a known classification.
#
# It is on every decision's hot path, so it is written out field by field and uses
# Rego's total order of values (null < booleans < numbers < strings < arrays <
# objects < sets) instead of one is_string() call per field: `x > ""; x < []`
# holds exactly when x is a non-empty string. tests/policy/test_conformance.py
# pins that ordering for the embedded engine; it is OPA's documented order.
valid(s) if {
	s.tenant > ""
	s.tenant < []
	s.classification > ""
	s.classification < []
	s.model > ""
	s.model < []
	s.model_revision > ""
	s.model_revision < []
	s.tokenizer > ""
	s.tokenizer < []
	s.tokenizer_revision > ""
	s.tokenizer_revision < []
	s.template_version > ""
	s.template_version < []
	s.classification in data.kvgov.config.classifications
	adapter_ok(s.adapter, s.adapter_revision)
}

# adapter_ok(a, r): no adapter (both null), or an adapter with its revision. An
# else chain, not two definitions, so the common case (no adapter) is the only
# body evaluated (on scope.valid's hot path).
adapter_ok(a, r) if {
	a == null
	r == null
} else := true if {
	a > ""
	a < []
	r > ""
	r < []
}

# invalid(s): why s is not a valid scope; undefined when it is valid. Only the
# error path computes it.
invalid(s) := "scope must be an object" if {
	not is_object(s)
} else := sprintf("scope field(s) missing or malformed: %s", [concat(", ", sort(missing(s)))]) if {
	count(missing(s)) > 0
} else := sprintf("unknown classification %v", [s.classification]) if {
	not s.classification in data.kvgov.config.classifications
} else := "adapter_revision must be null when adapter is null" if {
	s.adapter == null
	s.adapter_revision != null
} else := "adapter_revision is required when adapter is set" if {
	s.adapter != null
	s.adapter_revision == null
} else := "scope is invalid" if {
	not valid(s)
}

# tenant_config(t): the per-tenant overrides of tenant t ({} when none).
tenant_config(t) := object.get(data.kvgov.config, ["tenants", t], {})
