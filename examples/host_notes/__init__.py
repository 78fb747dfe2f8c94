"""An example host product for federation: notes over MCP, summaries written back over REST.

Run it with ``python -m examples.host_notes --port 0`` (from the repository
root); see this folder's README for the ``apollia.toml`` that points at it.
"""
