"""The sanitizer corpus: realistic error texts and what sanitizing must do.

Two kinds of entry, shared by ``test_sanitize_corpus.py`` (the contract) and
``benchmarks/bench_sanitize.py`` (recall, byte-identical share, cost):

- ``BENIGN``: messages the libraries we run on really produce (vLLM, PIL,
  pydantic, httpx, SQLite, msgspec, ZMQ, the OS, our own routes). They carry
  nothing private and must come out byte-identical.
- ``SECRET_CASES``: a secret in every common shape (``key: value``,
  ``key=value``, JSON and dict fields, headers, URLs with credentials, JWTs,
  PEM blocks, cloud and vendor keys, paths) placed in realistic surrounding
  text. For each, the secret values that must be removed and the surrounding
  text that must survive.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BENIGN", "SECRET_CASES", "Case"]


@dataclass(frozen=True)
class Case:
    """One message; ``remove`` must be absent after sanitizing, ``keep`` present."""

    text: str
    remove: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()


BENIGN: tuple[str, ...] = (
    # vLLM and the OpenAI protocol
    "This model's maximum context length is 4096 tokens. However, you requested "
    "5000 tokens (1000 in the messages, 4000 in the completion). Please reduce "
    "the length of the messages or completion.",
    "max_tokens must be at least 1, got 0.",
    "max_token=5 exceeds the remaining context",
    "max_tokens=16 is larger than max_model_len=8",
    "temperature must be non-negative, got -0.5.",
    "top_p must be in (0, 1], got 1.5.",
    "top_k must be -1 (disable), or at least 1, got 0.",
    "min_p must be in [0, 1], got 2.0.",
    "presence_penalty must be in [-2, 2], got 3.0.",
    "frequency_penalty must be in [-2, 2], got -4.0.",
    "repetition_penalty must be greater than zero, got 0.0.",
    "n must be at least 1, got 0.",
    "n=2 is not supported with beam search",
    "best_of must be greater than or equal to n, got n=3 and best_of=2.",
    "Cannot request more than 20 logprobs.",
    "logprobs must be non-negative, got -1.",
    "prompt_logprobs must be non-negative, got -2.",
    "stop_token_ids must be a list of integers",
    "seed must be an integer in [0, 2**64)",
    "The model `meta-llama/Llama-3.1-8B-Instruct` does not exist.",
    "The model `gpt-4o` does not exist.",
    "Either prompt or prompt_embeds must be provided.",
    "Stream options can only be defined when `stream=True`.",
    "tool_choice is not supported when tools are not provided",
    "Invalid value for `response_format.type`: 'json_schemas'",
    "Only 'text', 'json_object' and 'json_schema' response formats are supported",
    "Expected a list of messages, got an empty list",
    "messages must contain text",
    "Unsupported role 'function' in message 2",
    "LoRA adapter 'sql-lora' is not loaded",
    "LoRA rank 128 is greater than max_lora_rank 64.",
    "Requested more tokens than the KV cache can hold: 70000 > 65536",
    "Engine loop is not running. Inspect the stacktrace to find the original "
    "error: EngineDeadError.",
    "EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "The server had an error while processing your request.",
    "Request chatcmpl-abc123 was aborted",
    "Request cmpl-7f3e9a1c2b4d was preempted and will be recomputed",
    "A profiling session is already active. Call /stop_profile before starting "
    "another session.",
    "POST /v1/chat/completions is not available on this server",
    "GET /v1/videos/{video_id}/content: the job has no content yet",
    "Use /v1/images/edits to edit an image",
    "See https://docs.vllm.ai/en/latest/usage/ for details",
    "Consult https://platform.openai.com/docs/api-reference/chat for the schema",
    "The pipeline has no video stage; this route is unavailable.",
    "Stage 2 timed out after 30.0 s",
    "stage 4 (image) failed: the input image could not be decoded",
    "Queue is full: 128 requests waiting, retry later",
    "GPU memory utilization 0.95 is too high for 2 concurrent models",
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total "
    "capacity; 75.02 GiB already allocated)",
    "Bearer tokens are not accepted on this route",
    "Basic authentication is not supported",
    "Invalid or missing API key.",
    "The token budget of 8192 tokens per batch is exhausted",
    "Unknown special token '<|im_end|>' in stop list",
    "Unknown key 'foo' in generation_config",
    "sort_key=3 is out of range",
    "num_key=12, expected at most 8",
    "Tokenizer has no pad token; set pad_token_id=0 explicitly",
    "KeyError: 'token_type_ids'",
    "KeyError: 'lm_head.weight'",
    "ValueError: too many values to unpack (expected 2)",
    "TypeError: unsupported operand type(s) for +: 'int' and 'NoneType'",
    "RuntimeError: Expected all tensors to be on the same device, but found at "
    "least two devices, cuda:0 and cpu!",
    "AssertionError: block_size must be a power of two",
    "OverflowError: int too large to convert to float",
    "RecursionError: maximum recursion depth exceeded",
    "NotImplementedError: Video remix is not implemented by this server.",
    "Speculative decoding with n-gram lookup needs num_speculative_tokens >= 1",
    "Quantization method 'awq' is not supported for the current GPU. Minimum "
    "capability: 75. Current capability: 70.",
    "Chunked prefill is enabled with max_num_batched_tokens=2048.",
    "Risk-free task-specific desk-top request was rejected",
    "Héllo, 世界 — ünïcode stays 🙂",
    "Ratio 1/2 and 3/4 are fine, and/or either/or too",
    "sample rate 16000 Hz, 1 channel(s), 16-bit PCM",
    "voice 'alloy' is not available; choose one of alloy, echo, fable",
    "format 'mp3' is not supported; use 'wav'",
    "size must be 'WIDTHxHEIGHT', e.g. '128x128'",
    "seconds must be a positive number of seconds, e.g. '4'",
    "variant must be one of video, thumbnail, spritesheet",
    "limit must be an integer between 1 and 100",
    "after must be the id of a listed video job",
    "The video job is in progress; it has no content.",
    "No video job with this id.",
    "image/png and image/jpeg are supported; got image/webp",
    "Content type application/x-www-form-urlencoded is not accepted",
    "flag 0x1F is unknown",
    "Expected <path>, <redacted>, <data> and <address> placeholders",
    "token: 5 is not in the vocabulary",
    "key: prompt is required",
    "hf_transfer is not installed; falling back to the default downloader",
    "sk-learn is not a dependency of this project",
    "tokenizer_mode 'mistral' requires mistral_common>=1.5",
    "trust_remote_code=True is required to load this model",
    "dtype=float16 is not supported on CPU; use bfloat16",
    "tensor_parallel_size=4 exceeds the 2 available GPUs",
    "Requested guided_decoding_backend=outlines is not installed",
    # PIL
    "cannot identify image file",
    "Truncated IHDR chunk",
    "broken PNG file",
    "image file is truncated (3 bytes not processed)",
    "Image size (900000000 pixels) exceeds limit of 178956970 pixels, could be "
    "decompression bomb DOS attack.",
    "Image size (100000000 pixels) exceeds limit of 89478485 pixels, could be "
    "decompression bomb DOS attack.",
    "Not a PPM file",
    "Reading file header failed",
    "unknown raw mode for given image mode",
    "Unsupported BMP compression (4)",
    "not enough image data",
    "cannot write mode RGBA as JPEG",
    "Decompressed data too large for PngImagePlugin.MAX_TEXT_CHUNK",
    "Corrupt EXIF data.  Expecting to read 12 bytes but only got 2.",
    "image has wrong mode",
    "buffer is not large enough",
    "tile cannot extend outside image",
    "Invalid dimensions: 0x0",
    # pydantic
    "1 validation error for ChatCompletionRequest\nmessages\n  Field required "
    "[type=missing, input_value={'model': 'omni'}, input_type=dict]",
    "1 validation error for ImageGenerationRequest\nn\n  Input should be a valid "
    "integer, unable to parse string as an integer [type=int_parsing, "
    "input_value='two', input_type=str]",
    "Input should be a valid string [type=string_type, input_value=5, input_type=int]",
    "Input should be 'text' or 'audio' [type=literal_error, input_value='video', "
    "input_type=str]",
    "List should have at least 1 item after validation, not 0 [type=too_short, "
    "input_value=[], input_type=list]",
    "Extra inputs are not permitted [type=extra_forbidden, input_value=1, "
    "input_type=int]",
    "Input should be less than or equal to 2 [type=less_than_equal, "
    "input_value=3.5, input_type=float]",
    "For further information visit https://errors.pydantic.dev/2.11/v/missing",
    "Invalid request: messages: Field required",
    "Invalid request: body: JSON decode error",
    "Invalid request: temperature: Input should be a valid number",
    "Invalid request: messages.0.role: Input should be 'system', 'developer', "
    "'user', 'assistant' or 'tool'",
    "Value error, max_tokens must be positive",
    "Input should be a valid dictionary or instance of AudioOptions",
    "Unable to parse input string as a date",
    # httpx
    "Client error '404 Not Found' for url 'http://localhost:8000/v1/models'\nFor "
    "more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/"
    "Status/404",
    "Server error '503 Service Unavailable' for url 'http://127.0.0.1:8001/health'",
    "All connection attempts failed",
    "timed out",
    "Read timed out. (read timeout=30)",
    "[Errno 111] Connection refused",
    "Server disconnected without sending a response.",
    "peer closed connection without sending complete message body (incomplete "
    "chunked read)",
    "Redirect response '302 Found' for url 'https://huggingface.co/api/models'",
    "Request URL is missing an 'http://' or 'https://' protocol.",
    "Invalid port: ':abc'",
    "h11._util.LocalProtocolError: Too much data for declared Content-Length",
    # SQLite
    "database is locked",
    "no such table: jobs",
    "UNIQUE constraint failed: jobs.id",
    "NOT NULL constraint failed: jobs.status",
    "attempt to write a readonly database",
    "database disk image is malformed",
    "disk I/O error",
    'near "SELEC": syntax error',
    "table jobs has no column named error",
    "Cannot operate on a closed database.",
    "unable to open database file",
    # msgspec
    "Expected `int`, got `str` - at `$.params.n`",
    "Expected `object`, got `array`",
    "Object missing required field `type`",
    "JSON is malformed: trailing characters (byte 12)",
    "JSON is malformed: invalid character (byte 0)",
    "Input data was truncated",
    "Expected `str` of length <= 128, got `str` - at `$.request_id`",
    "Invalid enum value 'boom' - at `$.type`",
    "MessagePack data is malformed: trailing characters (byte 3)",
    "Integer value out of range - at `$.seed`",
    # ZMQ
    "Resource temporarily unavailable",
    "Socket operation on non-socket",
    "Address already in use (addr='tcp://127.0.0.1:5555')",
    "Operation cannot be accomplished in current state",
    "Context was terminated",
    "No such device (addr='tcp://eth7:5555')",
    "zmq.error.Again: Resource temporarily unavailable",
    "Host unreachable",
    # the OS and the interpreter
    "[Errno 98] Address already in use",
    "[Errno 28] No space left on device",
    "[Errno 12] Cannot allocate memory",
    "[Errno 24] Too many open files",
    "[Errno 32] Broken pipe",
    "[Errno 104] Connection reset by peer",
    "[Errno 110] Connection timed out",
    "[Errno 13] Permission denied",
    "[Errno -2] Name or service not known",
    "[Errno -3] Temporary failure in name resolution",
    "Killed by signal 9 (SIGKILL)",
    "stage process exited with code -9",
    "stage 3 (vocoder) died unexpectedly (exit code 1)",
    "worker exited with status 137",
    "BrokenProcessPool: A process in the process pool was terminated abruptly",
    "CancelledError",
    "asyncio.exceptions.TimeoutError",
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: "
    "invalid start byte",
    "MemoryError",
    "Operation not permitted",
    "Too many requests: 40 in flight, limit 32",
    "Payload of 33554432 bytes exceeds the limit of 16777216 bytes",
    "prompt must be at most 32000 characters",
    "image must be at most 16777216 bytes",
    "The image has 900000000 pixels; at most 16777216 are accepted.",
    "The image has 512 frames; at most 16 are accepted.",
    "audio is not a WAV file",
    "The request body must be a JSON object or a multipart form.",
    "File uploads are not accepted here",
    "Method Not Allowed",
    "Not Found",
    "Unsupported upgrade request.",
    "WebSocket protocol error: invalid close code 1005",
    "Expected ASGI message 'websocket.accept', but got 'http.response.start'",
    "invalid event type 'session.updat'",
    "event_id must be a string of at most 128 characters",
    "input_audio_buffer.append: audio must be base64",
    "session.update: voice must be a string",
    "Event too large: 2097152 bytes, limit 1048576",
    "Connection closed: 1008 (policy violation) client error",
    "Connection closed: 1011 (internal error) server error",
    # numbers, identifiers and formatting that look like secrets but are not
    "request 5f9c2b1e-7a4d-4c1e-9b2f-3d8e6a1c0f4b failed",
    "job video_8f14e45fceea167a5a36dedd4bea2543 is in progress",
    "commit 3f2a9c1 introduced the regression",
    "layer model.layers.31.mlp.down_proj has shape (4096, 14336)",
    "Loaded 291 tensors in 12.4 s (3.2 GiB/s)",
    "batch of 64 requests, 131072 tokens, 3 waiting",
    "version 0.33.0 is required, found 0.30.1",
    "port 8000 is in use; try --port 8001",
    "key 'messages' must be a list",
    "token id 128256 is out of range for a vocabulary of 128256",
    "Secret management is configured by the operator",
    "The password reset flow is not part of this API",
    "Keys are compared in constant time",
    "Bearer authentication failed",
    "Authorization header is missing",
    # near the shapes of the maintained rule set (detect-secrets), not secrets
    "API version 2 is not supported by this server",
    "ACK timeout after 30 s on stage 2",
    "SKU m5.large has no GPU",
    "global_batch_size=8 exceeds max_num_seqs=4",
    "Slack notifications are disabled",
    "aws_region=us-east-1 is not supported",
    "clip_model.key_proj.weight is missing from the checkpoint",
    "cloud provider 'gcp' is not configured",
    "The model `Qwen/Qwen2.5-Omni-7B` does not exist.",
    "secret rotation is handled by the operator, not by this server",
    "password_min_length=12 is enforced by the identity provider",
    "sha256 of the weights: "
    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    # a weak secret name, a colon and prose after it (issue 40): only a
    # value shaped like a credential goes
    "token: <|endoftext|> is not a special token of this tokenizer",
    "token: 128000 is the id of <|begin_of_text|>",
    "token: the prompt ends inside a multi-byte character",
    "key: model.layers.0.self_attn.q_proj.weight is missing from the checkpoint",
    "Missing key: lm_head.weight",
    "key: layer_12_attention_weights not found in the state dict",
    "key: max_num_batched_tokens must be at least max_model_len",
    "key: Qwen2VLForConditionalGeneration is not a registered architecture",
    "key: response_format.json_schema.strict is not supported",
    "Unknown key: speculative_config",
    "token: Qwen2TokenizerFast cannot decode id 151643",
    "sig: SIGTERM received, draining 3 requests",
    "key: 2024-06-01 is not a valid date",
    "token: 5f9c2b1e is an unknown request prefix",
    "key: image_url.detail must be one of low, high, auto",
    "token: gpt2 has no chat template",
)


# -- secrets ------------------------------------------------------------------

_JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkFsaWNlIn0."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
_PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n"
    "-----END PRIVATE KEY-----"
)
_RSA_PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
    "-----END RSA PRIVATE KEY-----"
)
_OPENSSH_PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "-----END OPENSSH PRIVATE KEY-----"
)

# (the secret as it appears in text, the values that must disappear)
SECRET_SHAPES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("password: hunter2", ("hunter2",)),
    ("password=hunter2", ("hunter2",)),
    ("PASSWORD = 'correct horse battery'", ("correct horse battery",)),
    ('db_password="Pa55w0rd!"', ("Pa55w0rd!",)),
    ("passwd: 123456", ("123456",)),
    ("api_key=a1b2c3d4e5f6", ("a1b2c3d4e5f6",)),
    ("api-key: 9f8e7d6c5b4a", ("9f8e7d6c5b4a",)),
    ("OPENAI_API_KEY=sk-proj-Q2x9ZmFrZUtleQ", ("sk-proj-Q2x9ZmFrZUtleQ",)),
    ("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUv", ("hf_AbCdEfGhIjKlMnOpQrStUv",)),
    ("token=ghs_RnVubnlUb2tlbg", ("ghs_RnVubnlUb2tlbg",)),
    ("access_token=ya29.a0AfH6SMBx", ("ya29.a0AfH6SMBx",)),
    ("refresh_token: 1//0gXyZ-refresh", ("1//0gXyZ-refresh",)),
    ("client_secret: GOCSPX-abc123XYZ", ("GOCSPX-abc123XYZ",)),
    ("secret=s3cr3t-value", ("s3cr3t-value",)),
    ('{"password": "hunter2"}', ("hunter2",)),
    ('{"api_key": "k-8f7e6d5c4b3a"}', ("k-8f7e6d5c4b3a",)),
    ("{'token': 'tok_live_4242'}", ("tok_live_4242",)),
    (
        '"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",),
    ),
    ("Authorization: Bearer " + _JWT, (_JWT, "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6")),
    ("Authorization: Token abc123", ("abc123",)),
    ("authorization: Basic dXNlcjpwYXNzd29yZA==", ("dXNlcjpwYXNzd29yZA",)),
    ("Proxy-Authorization: Digest c2VjcmV0", ("c2VjcmV0",)),
    ("X-Api-Key: 0123abcdef", ("0123abcdef",)),
    ("Cookie: session=8c2f9a; csrftoken=77e1", ("8c2f9a", "77e1")),
    ("Bearer zZ9-yY8.xX7", ("zZ9-yY8.xX7",)),
    ("bearer abc.def.ghi", ("abc.def.ghi",)),
    ("https://bob:s3cr3t@example.com/repo.git", ("s3cr3t", "bob:")),
    ("postgres://admin:Pa55@db.internal:5432/app", ("Pa55", "admin:")),
    ("redis://:r3d1s@cache:6379/0", ("r3d1s",)),
    (
        "https://x-access-token:ghp_A1b2C3d4E5f6G7h8I9j0K1l2@github.com/o/r.git",
        ("ghp_A1b2C3d4E5f6G7h8I9j0K1l2",),
    ),
    ("https://api.example.com/v1/x?api_key=abc123def&model=x", ("abc123def",)),
    (
        "https://store.blob.core.windows.net/c/b?sv=2022&sig=Zm9vYmFyYmF6%3D",
        ("Zm9vYmFyYmF6",),
    ),
    ("jwt " + _JWT, (_JWT, "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")),
    (_PEM, ("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",)),
    (_RSA_PEM, ("MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",)),
    (_OPENSSH_PEM, ("b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",)),
    ("AKIAIOSFODNN7EXAMPLE", ("AKIAIOSFODNN7EXAMPLE",)),
    ("ASIAY34FZKBOKMUTVV7A", ("ASIAY34FZKBOKMUTVV7A",)),
    (
        "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
        ("AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",),
    ),
    (
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        ("ghp_16C7e42F292c6912E7710c838347Ae178B4a",),
    ),
    (
        "github_pat_11ABCDEFG0123456789_abcdefghij",
        ("github_pat_11ABCDEFG0123456789_abcdefghij",),
    ),
    ("glpat-xXyYzZ0123456789ab", ("glpat-xXyYzZ0123456789ab",)),
    ("xoxb-123456789012-abcdefABCDEF", ("xoxb-123456789012-abcdefABCDEF",)),
    ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", ("sk_live_4eC39HqLyjWDarjtT1zdp7dc",)),
    ("sk-ant-api03-AbCdEf012345", ("sk-ant-api03-AbCdEf012345",)),
    ("sk-abcdefghijklmnopqrstuvwx", ("sk-abcdefghijklmnopqrstuvwx",)),
    (
        "AccountKey=lJzRc1YdHaAA2KCNJJ1tkYwF/+mKK6Ygw0NGe170Xu592euJv2wYUtBlV8z+qnlcNQSnIYVTkLWntUOOhVxR==",
        ("lJzRc1YdHaAA2KCNJJ1tkYwF",),
    ),
    ("/home/alice/.cache/huggingface/token", ("/home/alice", "huggingface/token")),
    ("C:\\Users\\bob\\secrets\\key.json", ("C:\\Users", "bob")),
    ("ipc:///tmp/vllm_omni_3f9a/stage0", ("/tmp/vllm_omni", "3f9a")),
)

# Realistic surroundings; ``{}`` is where the secret lands. Everything
# outside it must survive.
CONTEXTS: tuple[str, ...] = (
    "{}",
    "failed to load credentials ({}) from the environment",
    "httpx.HTTPStatusError: Client error '401 Unauthorized' while sending {}",
    "Invalid configuration: {} is not allowed in the pipeline file",
    "could not connect to the stage: {}",
    "ValueError: unexpected field in request {}, expected messages",
    "[Errno 13] Permission denied: {}",
)


def _secret_cases() -> tuple[Case, ...]:
    cases = []
    for index, (shape, values) in enumerate(SECRET_SHAPES):
        # Every shape alone, plus a rotating pair of surroundings, so each
        # context meets many shapes without a full cross product.
        for context in {
            CONTEXTS[0],
            CONTEXTS[1 + index % 6],
            CONTEXTS[1 + (index + 3) % 6],
        }:
            prefix, _, suffix = context.partition("{}")
            keep = tuple(part.strip() for part in (prefix, suffix) if part.strip())
            cases.append(Case(context.format(shape), values, keep))
    return tuple(cases)


_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/omni/vllm_omni/stages/image.py", line 52, in decode_image\n'
    '    return opened.convert("RGB")\n'
    "OSError: image file is truncated"
)

SECRET_CASES: tuple[Case, ...] = (
    *_secret_cases(),
    Case(
        _TRACEBACK,
        ("Traceback", "/srv/omni", 'File "'),
        ("OSError: image file is truncated",),
    ),
    Case(
        "[Errno 2] No such file or directory: '/home/alice/models/llama/config.json'",
        ("/home/alice",),
        ("[Errno 2] No such file or directory:",),
    ),
    Case(
        "cannot identify image file <_io.BytesIO object at 0x7f3a9c2b1d40>",
        ("0x7f3a9c2b1d40",),
        ("cannot identify image file", "_io.BytesIO object"),
    ),
    Case(
        "invalid image data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAA",
        ("iVBORw0KGgo",),
        ("invalid image",),
    ),
    Case(
        "1 validation error for Settings\napi_key\n  Input should be a valid string "
        "[type=string_type, input_value={'api_key': 'sk-proj-Zx81aaBB'}, "
        "input_type=dict]",
        ("sk-proj-Zx81aaBB",),
        ("1 validation error for Settings", "type=string_type"),
    ),
    Case(
        "sqlite3.OperationalError: unable to open database file "
        "/var/lib/omni/jobs.sqlite3",
        ("/var/lib/omni",),
        ("sqlite3.OperationalError: unable to open database file",),
    ),
    Case(
        "zmq.error.ZMQError: Address already in use (addr='ipc:///run/omni/s1')",
        ("/run/omni",),
        ("zmq.error.ZMQError: Address already in use",),
    ),
    Case(
        "Redirect response '302 Found' for url "
        "'https://user:tok3n@huggingface.co/api/models'",
        ("tok3n",),
        ("Redirect response '302 Found' for url", "huggingface.co/api/models"),
    ),
)
