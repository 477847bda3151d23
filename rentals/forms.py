from decimal import Decimal

from django import forms

KIND_CHOICES = [("", "Spot and on-demand"), ("spot", "Spot only"), ("on_demand", "On-demand only")]


class OfferFilterForm(forms.Form):
    gpu = forms.ChoiceField(required=False, label="GPU")
    kind = forms.ChoiceField(required=False, choices=KIND_CHOICES, label="Kind")
    max_price = forms.DecimalField(required=False, min_value=Decimal(0), decimal_places=4, label="Max price per hour")

    def __init__(self, *args, gpu_models: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu"].choices = [("", "Any GPU")] + [(g, g) for g in gpu_models]

    def apply(self, queryset):
        if not self.is_valid():
            return queryset
        data = self.cleaned_data
        if data.get("gpu"):
            queryset = queryset.filter(gpu_model__iexact=data["gpu"])
        if data.get("kind"):
            queryset = queryset.filter(is_spot=data["kind"] == "spot")
        if data.get("max_price") is not None:
            queryset = queryset.filter(price_per_hour__lte=data["max_price"])
        return queryset


class RentForm(forms.Form):
    hours = forms.FloatField(required=False, min_value=0.01, max_value=24 * 365)
