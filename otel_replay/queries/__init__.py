"""The SQL files (installed as package data of ``otel_replay.queries``); no code lives here."""
