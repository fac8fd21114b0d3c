"""One row per task identity (issue 23, finding 11).

``Cluster.poll_answered_at``: when the qstat of the last applied poll answered
(a snapshot is applied only if its qstat began after that). The constraint
``one_row_per_campaign_task``: task N of a campaign is one row. Rows a
database already holds twice (the seed replay's tasks 26.77 and 26.78: a done
row and an active row that ended "lost") are merged first into the row that
has the task's end: its accounting records, else the row with the runner
record, else the first one; the others' accounting records, requests and
events move to it, the runner record too when it has none, and they are
deleted.
"""
from django.db import migrations, models
from django.db.models import Count, Q

RUNNER_FIELDS = ("runner_record", "task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at",
                 "agent_exited_at", "teardown_done_at", "usage_flags", "verdict", "accounting_check",
                 "input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
                 "output_tokens", "reasoning_tokens", "cost_usd")


def merge_doubled_tasks(apps, schema_editor):
    Task = apps.get_model("dashboards", "Task")
    AccountingRecord = apps.get_model("dashboards", "AccountingRecord")
    ModelRequest = apps.get_model("dashboards", "ModelRequest")
    TaskEvent = apps.get_model("dashboards", "TaskEvent")
    doubled = (Task.objects.filter(campaign__isnull=False).values("campaign_id", "task_number")
               .annotate(n=Count("id")).filter(n__gt=1))
    for group in doubled:
        rows = list(Task.objects.filter(campaign_id=group["campaign_id"], task_number=group["task_number"])
                    .order_by("id"))
        with_records = {r.task_id for r in AccountingRecord.objects.filter(task__in=rows)}
        keeper = (next((r for r in rows if r.id in with_records and not r.active), None)
                  or next((r for r in rows if r.id in with_records), None)
                  or next((r for r in rows if r.runner_record), None) or rows[0])
        others = [r for r in rows if r.id != keeper.id]
        if keeper.runner_record is None:
            donor = next((r for r in others if r.runner_record), None)
            if donor is not None:
                for field in RUNNER_FIELDS:
                    setattr(keeper, field, getattr(donor, field))
                keeper.save(update_fields=list(RUNNER_FIELDS))
                ModelRequest.objects.filter(task=keeper).delete()
                ModelRequest.objects.filter(task=donor).update(task=keeper)
        ids = [r.id for r in others]
        AccountingRecord.objects.filter(task_id__in=ids).update(task=keeper)
        TaskEvent.objects.filter(task_id__in=ids).update(task=keeper)
        ModelRequest.objects.filter(task_id__in=ids).delete()
        Task.objects.filter(id__in=ids).delete()
    if schema_editor.connection.vendor == "postgresql":
        # The moves above leave deferred foreign-key checks pending in this migration's transaction, and
        # PostgreSQL refuses to build the constraint's index on a table with pending trigger events
        # ("cannot CREATE INDEX ... because it has pending trigger events"): run the checks now.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [("dashboards", "0017_api_token_password_stamp")]
    operations = [
        migrations.AddField(model_name="cluster", name="poll_answered_at",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.RunPython(merge_doubled_tasks, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.UniqueConstraint(condition=Q(campaign__isnull=False), fields=("campaign", "task_number"),
                                               name="one_row_per_campaign_task"),
        ),
    ]
