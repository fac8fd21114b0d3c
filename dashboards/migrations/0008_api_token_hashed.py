"""API tokens stored hashed (issue 11, finding 3).

Creates ``ApiToken`` (SHA-256 of the key) and moves every token of DRF's
``authtoken_token`` table, if the database has one, into it: each key is
hashed, so existing scripts keep working, and the plain keys are deleted
(overwritten on SQLite, ``PRAGMA secure_delete``).
"""
import hashlib

from django.conf import settings
from django.db import migrations, models


def hash_existing_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("dashboards", "ApiToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id, created FROM authtoken_token")
        rows = cursor.fetchall()
        for key, user_id, created in rows:
            token = ApiToken.objects.create(user_id=user_id, digest=hashlib.sha256(key.encode()).hexdigest(),
                                            prefix=key[:8])
            ApiToken.objects.filter(pk=token.pk).update(created=created)
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA secure_delete = ON")
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [
        ("dashboards", "0007_launch_states_endpoints_ceilings"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("digest", models.CharField(help_text="SHA-256 of the key, hex", max_length=64, unique=True)),
                ("prefix", models.CharField(help_text="the key's first 8 characters", max_length=8)),
                ("created", models.DateTimeField(auto_now_add=True)),
                ("user", models.OneToOneField(on_delete=models.deletion.CASCADE, related_name="api_token",
                                              to=settings.AUTH_USER_MODEL)),
            ],
        ),
        migrations.RunPython(hash_existing_tokens, migrations.RunPython.noop),
    ]
