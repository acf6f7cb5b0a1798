from pydantic import BaseModel


class BaseSpeech(BaseModel):
    model: str | None = None


class SpeechRequest(BaseSpeech):
    input: str
    voice: str | None = None
    speed: float = 1.0
    top_k: int = 50

    def check(self) -> None:
        if self.speed > 4:
            raise TypeError(f"too fast: {self.speed}")
