# Eviction: each tenant's KV cache floor and cap, and how long a priority lasts.
#
# input:  none (read once per bundle revision by the governor)
# output: decision = {tenants, errors}
#   tenants[t] = {"floor": q, "cap": q, "priority_duration": s} for every tenant
#     with any of them set, where q is {"blocks": n} (an integer >= 0),
#     {"fraction": f} (0 <= f <= 1, of the pool's blocks, rounded down) or null
#     (none), and s is seconds (> 0) or null (a priority never decays).
#   errors: every malformed entry, as text; the governor refuses a bundle with
#     any (kvgov.exceptions.InvalidQuota), as it refuses floors that add up to
#     more than the pool.
#
# Data (data.kvgov.config): tenants[t].kv_floor, tenants[t].kv_cap,
# tenants[t].priority_duration, and priority_duration (the bundle's default for
# every tenant). A tenant's floor is kept cached unless nothing else can be
# evicted; a tenant at its cap evicts its own blocks first; requests are never
# refused for quota (see docs/policy.md, "Eviction").
package kvgov.eviction

import rego.v1

tenants_config := object.get(data.kvgov.config, "tenants", {})

default_duration := object.get(data.kvgov.config, "priority_duration", null)

amount_keys := {"floor": "kv_floor", "cap": "kv_cap"}

# valid_amount(q): q is null, {"blocks": n} or {"fraction": f}.
valid_amount(q) if q == null

valid_amount(q) if {
	is_object(q)
	count(q) == 1
	n := q.blocks
	is_number(n)
	n >= 0
	n == round(n)
}

valid_amount(q) if {
	is_object(q)
	count(q) == 1
	f := q.fraction
	is_number(f)
	f >= 0
	f <= 1
}

valid_duration(s) if s == null

valid_duration(s) if {
	is_number(s)
	s > 0
}

configured(cfg) if object.get(cfg, "kv_floor", null) != null

configured(cfg) if object.get(cfg, "kv_cap", null) != null

configured(cfg) if object.get(cfg, "priority_duration", null) != null

configured(_) if default_duration != null

tenants[t] := {
	"floor": object.get(cfg, "kv_floor", null),
	"cap": object.get(cfg, "kv_cap", null),
	"priority_duration": object.get(cfg, "priority_duration", default_duration),
} if {
	some t, cfg in tenants_config
	is_object(cfg)
	configured(cfg)
}

errors contains msg if {
	some t, cfg in tenants_config
	is_object(cfg)
	some name, key in amount_keys
	q := object.get(cfg, key, null)
	not valid_amount(q)
	msg := sprintf("tenant %v: %v must be {\"blocks\": integer >= 0} or {\"fraction\": 0..1}", [t, key])
}

errors contains msg if {
	some t, cfg in tenants_config
	is_object(cfg)
	s := object.get(cfg, "priority_duration", null)
	not valid_duration(s)
	msg := sprintf("tenant %v: priority_duration must be a number of seconds > 0 or null", [t])
}

errors contains "priority_duration must be a number of seconds > 0 or null" if {
	not valid_duration(default_duration)
}

decision := {"tenants": tenants, "errors": errors}
