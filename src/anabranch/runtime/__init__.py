"""The runtime: composes agents, context, store and traces into running sessions."""
