"""The live views: the reads behind the queue, campaign and task pages, queue depth history, and the
WebSocket consumers and their routes.
"""
