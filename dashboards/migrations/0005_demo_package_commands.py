"""The demo agents moved from ``worker`` to the ``demo`` package: rewrite stored commands.

An agent definition's ``command`` is an argv list; ``-m worker.demo_agent``
and ``-m worker.review_agent`` (and the other demo modules) become
``-m demo.<module>``. Other commands are left as they are.
"""
from django.db import migrations

MOVED = {f"worker.{name}": f"demo.{name}"
         for name in ("demo_agent", "demo_model", "demo_sweep", "review_agent", "reference_checker")}


def forwards(apps, schema_editor):
    AgentDefinition = apps.get_model("dashboards", "AgentDefinition")
    for definition in AgentDefinition.objects.all():
        command = definition.command
        if isinstance(command, list) and any(arg in MOVED for arg in command):
            definition.command = [MOVED.get(arg, arg) for arg in command]
            definition.save(update_fields=["command"])


class Migration(migrations.Migration):
    dependencies = [("dashboards", "0004_accounting_indexes")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
