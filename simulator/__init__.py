"""Simulated pieces of the outside world: a fake OpenAI-compatible model
server and the reference node agent. Plain Python, never imports Django, so
it can run on a machine that has only the agent installed."""
