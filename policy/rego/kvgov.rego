# The bundle's root package: what every kvgov policy decision shares.
package kvgov

import rego.v1

# The classification labels this bundle knows (data.kvgov.config.classifications).
# A scope with any other label is refused by every decision.
classifications := {c | some c in data.kvgov.config.classifications}
