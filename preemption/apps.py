from django.apps import AppConfig


class PreemptionConfig(AppConfig):
    name = "preemption"
    verbose_name = "Cloud preemption"
    default_auto_field = "django.db.models.BigAutoField"
