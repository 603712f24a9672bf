"""Upstream error bodies the tests feed the gateway: a Python traceback a crashed server sends back."""

TRACEBACK = b"""Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/vllm/entrypoints/openai/api_server.py", line 412, in create
    generator = await openai_serving_chat.create_chat_completion(request, raw_request)
  File "/srv/app/secret_model_loader.py", line 88, in load
    raise RuntimeError("CUDA out of memory; weights at /mnt/weights/llama-70b/shard-00003.safetensors")
RuntimeError: CUDA out of memory; weights at /mnt/weights/llama-70b/shard-00003.safetensors
"""
