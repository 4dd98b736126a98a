"""The coordinator: jobs, their states and rounds, and the parties that run them."""
