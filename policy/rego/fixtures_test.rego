# Inputs shared by the bundle's tests (loaded only with the *_test.rego files).
package kvgov.fixtures

import rego.v1

scope := {
	"tenant": "acme",
	"classification": "internal",
	"model": "llama-3-8b",
	"model_revision": "r1",
	"adapter": null,
	"adapter_revision": null,
	"tokenizer": "llama3",
	"tokenizer_revision": "v1",
	"template_version": "sys-v3",
}

public_scope := object.union(scope, {"classification": "public"})

restricted_scope := object.union(scope, {"classification": "restricted"})

# A share group in which acme publishes public blocks and globex reads them.
docs_group := {"docs": {"publishers": ["acme"], "readers": ["globex"], "classifications": ["public"]}}
