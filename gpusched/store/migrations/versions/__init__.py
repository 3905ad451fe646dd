"""The revisions, oldest first by `down_revision` (Alembic reads every module here)."""
