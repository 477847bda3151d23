"""Insight pages: interruptions per capacity pool, and the spot economics calculator."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from preemption import charts, economics
from preemption.api import EconomicsQuerySerializer, economics_inputs, economics_result
from preemption.selectors import DAYS, pool_stats


@login_required
@require_GET
def insights(request: HttpRequest) -> HttpResponse:
    pools = pool_stats(daily=True)
    rows = [
        {"pool": p, "chart": charts.interruptions_per_day(p.daily, title=f"Interruptions per day in {p.label}")}
        for p in pools
    ]
    return render(request, "preemption/insights.html", {"rows": rows, "days": DAYS})


class EconomicsForm(forms.Form):
    on_demand_price = forms.FloatField(label="On-demand price P_on ($/h)", min_value=0, initial=4.0)
    discount = forms.FloatField(
        label="Spot discount d", min_value=0, max_value=1, initial=0.7, help_text="0.7: spot costs 30% of on-demand."
    )
    pool = forms.ChoiceField(
        label="Pool for M", required=False, help_text="Leave M empty to use this pool's measured MTBI."
    )
    mtbi_hours = forms.FloatField(
        label="Mean time between interruptions M (h)", min_value=0, required=False, initial=20.0
    )
    checkpoint_hours = forms.FloatField(label="Checkpoint write cost C (h)", min_value=0, initial=0.05)
    restart_hours = forms.FloatField(label="Restart cost R (h)", min_value=0, initial=0.1)
    work_hours = forms.FloatField(label="Useful compute W (h)", min_value=0, initial=100.0)
    interval_hours = forms.FloatField(
        label="Checkpoint interval T (h)", min_value=0, required=False, help_text="Empty: the optimum T_opt = √(2CM)."
    )

    def __init__(self, *args, pools=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["pool"].choices = [("", "—")] + [
            ("|".join(p.key), f"{p.label} (MTBI {p.mtbi_hours:.1f} h)") for p in pools if p.mtbi_hours is not None
        ]


@login_required
@require_GET
def economics_page(request: HttpRequest) -> HttpResponse:
    pools = pool_stats()
    submitted = bool(request.GET)
    form = EconomicsForm(request.GET if submitted else None, pools=pools)
    result = chart = None
    if submitted and form.is_valid():
        data = {k: v for k, v in form.cleaned_data.items() if v not in (None, "") and k != "pool"}
        if form.cleaned_data.get("pool"):
            data["cloud"], data["instance_type"], data["zone"] = (form.cleaned_data["pool"].split("|") + ["", ""])[:3]
        # The API's validation, so the page and GET /api/v1/economics can never disagree.
        query = EconomicsQuerySerializer(data=data)
        if query.is_valid():
            result = economics_result(query.validated_data)
            curve = economics.discount_curve(economics_inputs(query.validated_data))
            chart = charts.discount_curve(
                curve, optimum=result["optimal_interval_hours"], chosen=result["inputs"]["interval_hours"]
            )
        else:
            for field, errors in query.errors.items():
                form.add_error(field if field in form.fields else None, [str(e) for e in errors])
    return render(request, "preemption/economics.html", {"form": form, "result": result, "chart": chart})
