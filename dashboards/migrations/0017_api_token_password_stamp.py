"""API tokens bound to the password they were made under (issue 23, finding 4).

Adds ``ApiToken.password_stamp`` and stamps every existing token with its
user's present password hash, so tokens keep working until the next password
change (a token without a stamp never works).
"""
from django.db import migrations, models


def stamp_existing_tokens(apps, schema_editor):
    from dashboards.token_models import password_stamp

    ApiToken = apps.get_model("dashboards", "ApiToken")
    for token in ApiToken.objects.select_related("user"):
        ApiToken.objects.filter(pk=token.pk).update(password_stamp=password_stamp(token.user.password))


class Migration(migrations.Migration):
    dependencies = [("dashboards", "0016_cluster_poll_observed_at")]
    operations = [
        migrations.AddField(
            model_name="apitoken", name="password_stamp",
            field=models.CharField(blank=True, default="", max_length=64,
                                   help_text="HMAC of the user's password hash when the token was made"),
        ),
        migrations.RunPython(stamp_existing_tokens, migrations.RunPython.noop),
    ]
