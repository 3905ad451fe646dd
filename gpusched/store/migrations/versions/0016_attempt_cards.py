"""The cards each requeued run held (`job_attempts.gpu_uuids`, `gpu_indices`),
so that a node heard again, or its daemon started again, can take back a run that still
goes on (the job `running` there again on those cards) rather than stop it and run the
job a second time.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only what is missing: a database made by create_all() from the current tables has it.
    present = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("job_attempts")}
    for name in ("gpu_uuids", "gpu_indices"):
        if name not in present:
            op.add_column("job_attempts", sa.Column(name, sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("gpu_indices")
        batch.drop_column("gpu_uuids")
