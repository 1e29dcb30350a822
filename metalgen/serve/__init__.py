"""`metalgen serve`: an OpenAI-compatible HTTP server (docs/serve.md).

protocol.py parses and checks the requests and shapes the responses, engine.py runs generations one at a
time on a worker thread with one reused prompt cache, app.py is the Starlette application, choices.py turns
a request's jobs (one a choice) into its answer, with reasoning.py (thinking blocks), tools.py (tool calls)
and logprobs.py (token logprobs); speech.py
serves /v1/audio/speech when the model is a speech model (Qwen3-TTS).
"""
