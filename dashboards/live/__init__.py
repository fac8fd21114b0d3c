"""The live views: the reads behind the queue, campaign and task pages, queue depth history; the one
producer that builds each watched view once per change and audience (publish, snapshots), the web
processes' fan-out of its bytes (hub), and the WebSocket consumers and their routes (docs/live.md).
"""
