"""The docs test: every command and code block of README.md and docs/ runs."""
