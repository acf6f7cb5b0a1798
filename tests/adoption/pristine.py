"""What the unpatched vllm-omni 0.30.0 does today: the contract's tests that
fail on it, each with why (the reason) and how its failure reads (a regular
expression its failure message must match).

``conftest.py`` holds the pristine tree to this list: a listed test must
fail matching its pattern (it is then reported as an expected failure); a
listed test that passes, or fails otherwise, fails the run; every key must
name a test. docs/adoption.md shows the same list beside the series'
effect.
"""

from __future__ import annotations

_CATCH_ALL = (
    "the chat route's `except Exception` answers 500 'Internal Server Error' "
    "before any handler: the engine's client error loses its status and param"
)
_RAW_TEXT = "a raw exception's text (traceback, API key) is the public message"
_VALUE_ERROR_400 = (
    "any ValueError is the client's fault: an engine-side one answers 400 "
    "(RFC problem 1)"
)
_BODY_VALIDATION = (
    "vLLM's validation handler: type 'Bad Request', param 'body.temperature', "
    "the rejected value echoed"
)
_WS_FLAT = (
    "0.30's WebSocket error events are each handler's own ({type, message}, or "
    "{type, error: <text>, code}): no status, type or param; pydantic's text "
    "echoes the rejected value"
)
_NO_DETAILS = (
    "0.30's offline path raises OmniClientError(ValueError) or RuntimeError, "
    "without .details"
)

# test name -> (reason, pattern of the failure)
EXPECTED: dict[str, tuple[str, str]] = {
    "test_one_canonical_envelope[bad_temperature]": (
        _BODY_VALIDATION,
        r"type 'Bad Request'",
    ),
    "test_one_canonical_envelope[generate_error]": (
        "EngineGenerateError answers 500 with an empty message",
        r"empty message",
    ),
    "test_one_canonical_envelope[not_found]": (_CATCH_ALL, r"assert 500 == 404"),
    "test_one_canonical_envelope[runtime_secret]": (
        _RAW_TEXT,
        r"type 'Internal Server Error'",
    ),
    "test_one_canonical_envelope[validation_top_k]": (_CATCH_ALL, r"assert 500 == 400"),
    "test_one_canonical_envelope[value_error]": (
        _VALUE_ERROR_400,
        r"assert 400 == 500",
    ),
    "test_one_canonical_envelope[value_error_secret]": (
        _VALUE_ERROR_400,
        r"assert 400 == 500",
    ),
    "test_engine_value_error_is_500[value_error]": (_VALUE_ERROR_400, r"answered 400"),
    "test_engine_value_error_is_500[value_error_secret]": (
        _VALUE_ERROR_400,
        r"answered 400",
    ),
    "test_client_mistake_is_4xx_with_param[bad_temperature]": (
        _BODY_VALIDATION,
        r"'body\.temperature' == 'temperature'",
    ),
    "test_client_mistake_is_4xx_with_param[validation_top_k]": (
        _CATCH_ALL,
        r"assert 500 < 500",
    ),
    "test_no_private_text_in_body[value_error_secret]": (
        _RAW_TEXT,
        r"shows a traceback, a secret",
    ),
    "test_no_private_text_in_body[runtime_secret]": (
        _RAW_TEXT,
        r"shows a traceback, a secret",
    ),
    "test_no_private_text_in_body[bad_temperature]": (
        _BODY_VALIDATION,
        r"shows a rejected value",
    ),
    "test_failure_after_stream_started_is_one_terminal_event[stream_generate_error]": (
        "the SSE error event of an EngineGenerateError has an empty message",
        r"empty message",
    ),
    "test_failure_after_stream_started_is_one_terminal_event[stream_runtime_secret]": (
        "the SSE error event shows the raw exception text (traceback, API key)",
        r"shows a traceback, a secret",
    ),
    "test_unknown_model_on_diffusion_chat_is_404": (
        "the diffusion chat route never checks the model: 200 with a text reply",
        r"Image generation completed but no images",
    ),
    "test_sync_video_failure_is_canonical": (
        "/v1/videos/sync answers 500 'Video generation failed: <raw text>'",
        r"shows a traceback, a secret",
    ),
    "test_failed_video_job_stores_the_canonical_error": (
        "a failed job stores {code, message} with the raw text (traceback, path, key)",
        r"shows a traceback, a path, a secret",
    ),
    "test_stage_error_message_raises_the_semantic_type[fields0-client-400]": (
        _NO_DETAILS,
        r"OmniClientError'>, <class 'ValueError'>.*is no VLLMClientError",
    ),
    "test_stage_error_message_raises_the_semantic_type[fields1-client-404]": (
        _NO_DETAILS,
        r"OmniClientError'>, <class 'ValueError'>.*is no VLLMClientError",
    ),
    "test_stage_error_message_raises_the_semantic_type[fields2-server-500]": (
        _NO_DETAILS,
        r"RuntimeError'>.*is no VLLMServerError",
    ),
    "test_stage_error_message_raises_the_semantic_type[fields3-server-500]": (
        _NO_DETAILS,
        r"RuntimeError'>.*is no VLLMServerError",
    ),
    "test_stage_error_message_keeps_its_record": (
        "0.30 has no OmniErrorDetails, and ErrorMessage no record",
        r"cannot import name 'OmniErrorDetails'",
    ),
    "test_engine_output_error_raises_engine_generate_error_with_stage": (
        _NO_DETAILS,
        r"EngineGenerateError has no \.details",
    ),
    "test_diffusion_output_error_raises_the_semantic_type[422-client]": (
        _NO_DETAILS,
        r"OmniClientError'>, <class 'ValueError'>.*is no VLLMClientError",
    ),
    "test_diffusion_output_error_raises_the_semantic_type[500-server]": (
        _NO_DETAILS,
        r"RuntimeError'>.*is no VLLMServerError",
    ),
    "test_stage_failure_message_carries_the_record": (
        "0.30 has no OmniErrorDetails, and its stage senders no record",
        r"cannot import name 'OmniErrorDetails'",
    ),
    "test_stage_failure_without_status_carries_a_server_record": (
        "0.30 has no OmniErrorDetails, and its stage senders no record",
        r"cannot import name 'OmniErrorDetails'",
    ),
    "test_bad_lora_on_sync_video_is_400_naming_the_field": (
        "serving_video turns the LoRA ValueError into HTTPException(400): "
        "type 'Bad Request', no param",
        r"type 'Bad Request' is not the type of a 400",
    ),
    "test_unavailable_websocket_route_is_a_canonical_501": (
        _WS_FLAT,
        r"no canonical error object: \{'type': 'error', 'message': 'Streaming video",
    ),
    "test_invalid_speech_session_config_is_400_naming_the_field": (
        _WS_FLAT,
        r"no canonical error object: .*Invalid session config",
    ),
    "test_bad_session_format_is_400_naming_the_field": (
        _WS_FLAT,
        r"no canonical error object: .*Invalid session.start format",
    ),
    "test_invalid_session_field_is_400_without_the_rejected_value": (
        _WS_FLAT,
        r"no canonical error object: .*Invalid session.start: 1 validation error",
    ),
    "test_speech_without_audio_output_is_500": (
        "the speech module's own 'no audio in the output' check is a ValueError, "
        "answered 400 as the client's",
        r"assert 400 == 500",
    ),
    "test_malformed_ref_audio_is_400_naming_the_field": (
        "the ref_audio validator raises TypeError: 400 without param",
        r"assert None == 'ref_audio'",
    ),
    "test_realtime_refusal_is_canonical_and_keeps_its_code": (
        _WS_FLAT,
        r"no canonical error object: .*'error': 'VAD realtime is not enabled'",
    ),
}
