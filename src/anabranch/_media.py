"""Images and documents: the binary blocks of the message model (raw bytes in Python,
standard base64 in JSON), checked as the API checks them."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_serializer, field_validator, model_validator

from anabranch._text import ValidText

__all__ = ["IMAGE_MEDIA_TYPES", "Document", "Image", "sniff_image_type"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
ImageMediaType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_image_type(data: bytes) -> str | None:
    """The image media type ``data`` starts like, or ``None`` if it is no known image."""
    for magic, media_type in _MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _decode_data(value: Any) -> Any:
    """Raw bytes stay as they are; a string is base64 (how JSON carries them)."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"data is not valid base64: {exc}") from None
    return value


class _Binary(_Frozen):
    @field_validator("data", mode="before", check_fields=False)
    @classmethod
    def _base64(cls, value: Any) -> Any:
        return _decode_data(value)

    @field_serializer("data", when_used="json", check_fields=False)
    def _as_base64(self, value: bytes | None) -> str | None:
        """Standard base64 in JSON, exactly as the API carries it."""
        return base64.b64encode(value).decode() if value is not None else None

    @property
    def size(self) -> int:
        """Bytes of the payload (0 for a URL source)."""
        data = getattr(self, "data", None)
        text = getattr(self, "text", None)
        if data is not None:
            return len(data)
        return len(text.encode()) if text is not None else 0

    @property
    def base64_data(self) -> str:
        data = getattr(self, "data", None)
        return base64.b64encode(data).decode() if data is not None else ""


class Image(_Binary):
    """An image for the model: raw bytes with their media type, or a URL.

    ``Image(data=png_bytes, media_type="image/png")`` or ``Image(url="https://...")``.
    The bytes must really be of ``media_type`` (checked here, as the API would).
    """

    type: Literal["image"] = "image"
    media_type: ImageMediaType | None = None
    data: bytes | None = None
    url: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Image:
        if (self.data is None) == (self.url is None):
            raise ValueError("an Image needs exactly one of data= or url=")
        if self.data is not None:
            if self.media_type is None:
                raise ValueError("an Image with data= needs media_type= (e.g. 'image/png')")
            if not self.data:
                raise ValueError("an Image's data is empty")
            found = sniff_image_type(self.data)
            if found != self.media_type:
                seen = f"a {found} image" if found else "no known image format"
                raise ValueError(
                    f"the image was given as {self.media_type} but its bytes are {seen}"
                )
        elif self.url is not None and not self.url.startswith(("https://", "http://")):
            raise ValueError("an Image url must start with https:// or http://")
        return self


class Document(_Binary):
    """A document for the model: a PDF (bytes or URL) or plain text.

    ``Document(data=pdf_bytes)``, ``Document(url="https://.../a.pdf")`` or
    ``Document(text="...", title="notes.txt")``.
    """

    type: Literal["document"] = "document"
    media_type: Literal["application/pdf", "text/plain"] = "application/pdf"
    data: bytes | None = None
    url: str | None = None
    text: ValidText | None = None
    title: str | None = None
    context: ValidText | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_is_plain(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("text") is not None:
            value = {**value, "media_type": value.get("media_type", "text/plain")}
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Document:
        sources = [s for s in (self.data, self.url, self.text) if s is not None]
        if len(sources) != 1:
            raise ValueError("a Document needs exactly one of data=, url= or text=")
        if self.text is not None and self.media_type != "text/plain":
            raise ValueError("a text Document has media_type 'text/plain'")
        if self.data is not None:
            if self.media_type != "application/pdf" or not self.data.startswith(b"%PDF-"):
                raise ValueError("a Document with data= must be a PDF (bytes starting %PDF-)")
        if self.url is not None and not self.url.startswith(("https://", "http://")):
            raise ValueError("a Document url must start with https:// or http://")
        return self
