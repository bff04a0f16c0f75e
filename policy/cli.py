"""`kvgov policy ...` commands (placeholder until the policy issue lands)."""

import click

policy_group = click.Group("policy", help="Test and evaluate the Rego policy bundle.")
