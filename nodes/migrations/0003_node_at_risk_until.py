from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("nodes", "0002_served_model_on_demand_floor"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="at_risk_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="reclaim",
            index=models.Index(
                condition=models.Q(("trigger", "preemption")), fields=["started_at"], name="reclaim_preemption"
            ),
        ),
    ]
