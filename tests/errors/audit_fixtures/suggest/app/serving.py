"""Serving."""

from app.protocol.speech import SpeechRequest


class Server:
    def create(self, request: SpeechRequest) -> str:
        if not request.input:
            raise ValueError("input must not be empty")
        if request.top_k < 1:
            raise ValueError("top_k must be at least 1")
        if request.voice not in VOICES:
            raise ValueError(f"Unknown voice {request.voice!r}")
        try:
            if request.speed <= 0:
                raise ValueError("'speed' must be positive")
            result = self.engine(request)
        except ValueError as exc:
            return self.create_error_response(str(exc))
        if result is None:
            raise ValueError("No output generated from the model.")
        return result

    def internal(self, x: int) -> None:
        if x < 0:
            raise ValueError("negative x")

    def broad(self, request: SpeechRequest) -> None:
        try:
            self.engine(request)
        except Exception as exc:
            raise ValueError(f"engine said {exc}") from exc

    def mixed(self, request: SpeechRequest) -> None:
        try:
            if request.speed > 2:
                raise ValueError("speed must be at most 2")
            if self.busy:
                raise RuntimeError("busy")
        except ValueError:
            raise
        try:
            self.engine(request)
        except TypeError as exc:
            return self.create_error_response(str(exc))
