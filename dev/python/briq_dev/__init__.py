"""Development helpers for briq-operator, in neither published distribution: `local_stack` (runs
`briq-dev local-stack` for the agent tests and benchmarks), `demo_agent` (the demo's CodeAgent)
and `scripted_model` (a deterministic smolagents model). Installed editable in the test venv
only (.ci/python-env.sh)."""
