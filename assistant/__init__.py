"""A read-only assistant interface to tco: an MCP server (Model Context Protocol, the ``mcp`` package).

An AI assistant connects over stdio (``python -m assistant``) or streamable
HTTP on loopback (``python -m assistant --http --port N``) and calls tools
that answer what tco's pages and API answer: the queue summary, a campaign, a
task, why a task is pending (with the scheduler facts behind each reason) and
a team's bill. Every call is made as the user whose tco API token the
assistant presents, through ``dashboards.selectors``' scoping: it sees
exactly what that user sees, and nothing it calls changes anything.

Modules: ``views`` (the answers, plain Django), ``facts`` (the scheduler
facts behind a pending task), ``server`` (the MCP tools and the token check),
``__main__`` (the command line).
"""
