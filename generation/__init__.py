"""mlxgraph.generation: the generation library (never imports torch).

loop.py is the token loop (chunked prefill, pipelined decode, stats); text.py is text in,
text out (``generate``, ``stream_generate``); batch.py decodes many prompts together
(``batch_generate``, over ``Program.step_batch``); chat_session.py is ``ChatSession``;
sampling.py and stop_text.py are its parts; options.py holds its typed options
(``SessionOptions``, ``SamplingOptions``), checked once. The CLI (tools/) and the server
(tools/serve/) call it; it never reads command-line arguments.
"""
