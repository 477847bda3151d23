from django import forms


class NodeCreateForm(forms.Form):
    """The fields of POST /api/v1/nodes; hardware is optional (the agent reports it on hello)."""

    name = forms.CharField(max_length=100)
    is_spot = forms.BooleanField(
        required=False,
        label="Spot",
        help_text="You may take a spot node back at any time with Pause: its work drains within two minutes.",
    )
    price_per_hour = forms.DecimalField(max_digits=10, decimal_places=4, min_value=0, label="Price per hour (USD)")
    gpu_model = forms.CharField(max_length=64, required=False, label="GPU model")
    gpu_count = forms.IntegerField(min_value=0, max_value=1024, required=False, label="GPU count")
    vram_gb = forms.IntegerField(min_value=0, max_value=100000, required=False, label="VRAM (GB)")
    cloud = forms.CharField(max_length=32, required=False)
    instance_type = forms.CharField(max_length=64, required=False)
    region = forms.CharField(max_length=64, required=False)
    zone = forms.CharField(max_length=64, required=False)
    cloud_instance_id = forms.CharField(max_length=128, required=False, label="Cloud instance id")

    def node_fields(self) -> dict:
        """Cleaned values for create_node, leaving out what the owner did not fill in."""
        return {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}
