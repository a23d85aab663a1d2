"""BuildMax's Model Context Protocol plugin: every plugin's agent tools
(``buildmax_agent_tools``) served over streamable HTTP at ``/mcp``, in the
server's own process, and ``buildmax mcp stdio`` for clients that launch a
stdio server."""
