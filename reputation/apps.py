from django.apps import AppConfig


class ReputationConfig(AppConfig):
    name = "reputation"
    default_auto_field = "django.db.models.BigAutoField"
