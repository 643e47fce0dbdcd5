"""Auto-instrumentation: wrapt-based instrumentors for LLM clients, HTTP clients and agent tools."""
