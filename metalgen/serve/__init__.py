"""`metalgen serve`: an OpenAI-compatible HTTP server (docs/serve.md).

protocol.py parses and checks the requests and shapes the responses, engine.py runs generations one at a
time on a worker thread with one reused prompt cache, app.py is the Starlette application.
"""
