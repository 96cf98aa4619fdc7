"""Entry points: parse, wire and present; one command per module, no decisions here."""

__all__: list[str] = []
