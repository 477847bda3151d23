"""Workers and slots are rewritten on every router request: on PostgreSQL, leave room
on each page for in-page updates and let autovacuum visit them far more often."""

from django.db import migrations

TUNE = """
ALTER TABLE nodes_worker SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
ALTER TABLE nodes_slot SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000);
"""
UNTUNE = """
ALTER TABLE nodes_worker RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
ALTER TABLE nodes_slot RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
"""


def tune(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TUNE)


def untune(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(UNTUNE)


class Migration(migrations.Migration):
    dependencies = [("nodes", "0003_node_at_risk_until")]
    operations = [migrations.RunPython(tune, untune)]
