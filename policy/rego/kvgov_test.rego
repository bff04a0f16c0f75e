package kvgov_test

import rego.v1

test_classifications_are_the_four_labels if {
	data.kvgov.classifications == {"public", "internal", "confidential", "restricted"}
}

test_classifications_follow_data if {
	data.kvgov.classifications == {"public", "secret"} with data.kvgov.config.classifications as ["public", "secret"]
}
