from django.conf import settings
from django.db import models
from django.utils import timezone


class Standing(models.TextChoices):
    LISTED = "listed"
    DELISTED = "delisted"


class NodeReputation(models.Model):
    node = models.OneToOneField("nodes.Node", on_delete=models.CASCADE, primary_key=True, related_name="reputation")
    successes = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    spot_left_out = models.PositiveIntegerField(default=0)
    score = models.FloatField()
    updated_at = models.DateTimeField(default=timezone.now)

    @property
    def counted(self) -> int:
        return self.successes + self.failures


class ProviderReputation(models.Model):
    provider = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="reputation")
    successes = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    spot_left_out = models.PositiveIntegerField(default=0)
    score = models.FloatField()
    updated_at = models.DateTimeField(default=timezone.now)
    standing = models.CharField(max_length=16, choices=Standing.choices, default=Standing.LISTED)
    # After staff reinstate a provider, only a failure after this moment can delist again.
    reinstated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["standing"])]

    @property
    def counted(self) -> int:
        return self.successes + self.failures


class StandingChange(models.Model):
    """Who delisted or reinstated a provider, when and why (staff actions and the automatic rule)."""

    provider = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="standing_changes")
    standing = models.CharField(max_length=16, choices=Standing.choices)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.CharField(max_length=500)
    score = models.FloatField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at"]
