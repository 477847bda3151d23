"""Spot economics: the formulas on hand-computed cases, the no-progress case, T_opt, the API's validation."""

import math

import pytest

from preemption import economics
from preemption.economics import Inputs, compute, optimal_interval, wall_clock_hours
from tests.preemption import docs
from tests.preemption.docs import signed_post


def inputs(**overrides) -> Inputs:
    values = dict(on_demand_price=2.0, discount=0.7, mtbi_hours=10.0, checkpoint_hours=0.05, restart_hours=0.1, work_hours=100.0, interval_hours=1.0)
    values.update(overrides)
    return Inputs(**values)


def test_hand_computed_case():
    # 1 - 0.05/1 - (0.5 + 0.1)/10 = 1 - 0.05 - 0.06 = 0.89
    result = compute(inputs())
    assert result.progress_rate == pytest.approx(0.89)
    assert result.wall_clock_hours == pytest.approx(100 / 0.89)  # 112.36 h
    assert result.cost_spot == pytest.approx(100 / 0.89 * 2.0 * 0.3)  # 67.42
    assert result.cost_on_demand == pytest.approx(200.0)
    assert result.cost_ratio == pytest.approx((1 / 0.89) * 0.3)  # 0.3371
    assert result.effective_discount == pytest.approx(1 - 0.3 / 0.89)  # 0.6629
    assert result.no_net_progress is False
    assert result.inputs == {
        "on_demand_price": 2.0, "discount": 0.7, "mtbi_hours": 10.0, "checkpoint_hours": 0.05,
        "restart_hours": 0.1, "work_hours": 100.0, "interval_hours": 1.0, "interval_is_optimal": False,
    }


def test_second_hand_computed_case_no_discount_no_interruption_cost():
    # C = 0.1, T = 2, R = 0, M = 100: 1 - 0.05 - 1/100 = 0.94; d = 0 so spot costs more than on demand.
    result = compute(inputs(checkpoint_hours=0.1, interval_hours=2.0, restart_hours=0.0, mtbi_hours=100.0, discount=0.0, on_demand_price=1.0, work_hours=47.0))
    assert result.wall_clock_hours == pytest.approx(50.0)
    assert result.cost_spot == pytest.approx(50.0) and result.cost_on_demand == pytest.approx(47.0)
    assert result.effective_discount == pytest.approx(1 - 50 / 47)


def test_young_optimal_interval_is_the_default_t():
    assert optimal_interval(checkpoint_hours=0.05, mtbi_hours=10.0) == pytest.approx(1.0)  # sqrt(2 * 0.05 * 10)
    assert optimal_interval(checkpoint_hours=0.02, mtbi_hours=25.0) == pytest.approx(1.0)
    result = compute(inputs(interval_hours=None))
    assert result.inputs["interval_hours"] == pytest.approx(1.0) and result.inputs["interval_is_optimal"] is True
    # T_opt maximises progress: nearby intervals do no better.
    best = result.progress_rate
    for t in (0.5, 0.9, 1.1, 2.0):
        assert compute(inputs(interval_hours=t)).progress_rate < best


def test_no_net_progress_says_so_and_names_r():
    # R = 12 h against M = 10 h: no interval can help.
    result = compute(inputs(restart_hours=12.0))
    assert result.no_net_progress is True and result.progress_rate <= 0
    assert result.wall_clock_hours is None and result.cost_spot is None and result.cost_ratio is None and result.effective_discount is None
    assert result.cost_on_demand == pytest.approx(200.0)
    assert "no net progress" in result.message and "R is the term to fix" in result.message


def test_zero_denominator_is_no_progress_too():
    # 1 - 0.5/1 - (0.5 + 0)/1 = 0 exactly.
    assert wall_clock_hours(work_hours=1, checkpoint_hours=0.5, restart_hours=0, mtbi_hours=1, interval_hours=1) is None
    assert compute(inputs(checkpoint_hours=0.5, restart_hours=0.0, mtbi_hours=1.0)).no_net_progress is True


def test_bad_interval_alone_is_no_progress_and_the_message_points_at_the_optimum():
    result = compute(inputs(interval_hours=30.0))  # 1 - 0.05/30 - 15.1/10 < 0
    assert result.no_net_progress is True and "optimal interval" in result.message


def test_free_checkpoints_take_the_limit():
    result = compute(inputs(checkpoint_hours=0.0, interval_hours=None))
    assert result.optimal_interval_hours == 0 and result.progress_rate == pytest.approx(1 - 0.1 / 10)


def test_discount_curve_is_flat_around_the_optimum():
    curve = economics.discount_curve(inputs(interval_hours=None))
    assert len(curve) == 48 and curve[0][0] == pytest.approx(1 / 8) and curve[-1][0] == pytest.approx(4.0)
    values = [v for _, v in curve if v is not None]
    best = max(values)
    at_opt = 1 - 0.3 / (1 - 0.05 - 0.6 / 10)
    assert best == pytest.approx(at_opt, abs=1e-3)
    near = [v for t, v in curve if 0.7 <= t <= 1.4]
    assert all(best - v < 0.01 for v in near)


@pytest.mark.parametrize("bad", [dict(discount=1.5), dict(mtbi_hours=0.0), dict(work_hours=-1.0), dict(interval_hours=0.0)])
def test_compute_refuses_invalid_inputs(bad):
    with pytest.raises(ValueError):
        compute(inputs(**bad))


QUERY = "on_demand_price=2&discount=0.7&mtbi_hours=10&checkpoint_hours=0.05&restart_hours=0.1&work_hours=100"


@pytest.mark.django_db
def test_api_economics_defaults_t_to_the_optimum_and_shows_its_inputs(owner_api):
    response = owner_api.get(f"/api/v1/economics?{QUERY}")
    assert response.status_code == 200
    body = response.json()
    assert body["optimal_interval_hours"] == pytest.approx(1.0)
    assert body["wall_clock_hours"] == pytest.approx(100 / 0.89)
    assert body["cost_ratio"] == pytest.approx(0.3 / 0.89) and body["no_net_progress"] is False
    assert body["inputs"]["interval_hours"] == pytest.approx(1.0) and body["inputs"]["mtbi_source"] == "given"


@pytest.mark.django_db
def test_api_economics_no_progress_has_null_costs(owner_api):
    body = owner_api.get(f"/api/v1/economics?{QUERY.replace('restart_hours=0.1', 'restart_hours=20')}").json()
    assert body["no_net_progress"] is True and body["wall_clock_hours"] is None and body["cost_spot"] is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "field"),
    [
        (QUERY.replace("on_demand_price=2&", ""), "on_demand_price"),
        (QUERY.replace("discount=0.7", "discount=-0.1"), "discount"),
        (QUERY.replace("discount=0.7", "discount=1.2"), "discount"),
        (QUERY.replace("mtbi_hours=10", "mtbi_hours=-3"), "mtbi_hours"),
        (QUERY.replace("&mtbi_hours=10", ""), "mtbi_hours"),
        (QUERY.replace("checkpoint_hours=0.05", "checkpoint_hours=-1"), "checkpoint_hours"),
        (QUERY.replace("restart_hours=0.1", "restart_hours=abc"), "restart_hours"),
        (QUERY.replace("work_hours=100", "work_hours=-100"), "work_hours"),
        (QUERY + "&interval_hours=-1", "interval_hours"),
        (QUERY + "&interval_hours=0", "interval_hours"),
    ],
)
def test_api_economics_missing_or_negative_input_is_400_with_the_field(owner_api, query, field):
    response = owner_api.get(f"/api/v1/economics?{query}")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid" and body["detail"] and field in body and body[field]


@pytest.mark.django_db
def test_api_economics_m_defaults_to_a_pools_measured_mtbi(owner_api, prod):
    from datetime import timedelta

    from rest_framework.test import APIClient

    from nodes.models import Node

    node, _ = docs.cloud_node(instance_id="i-0m")
    Node.objects.filter(pk=node.pk).update(created_at=docs.T0 - timedelta(hours=40), last_seen_at=docs.T0)
    query = QUERY.replace("&mtbi_hours=10", "") + "&cloud=aws&instance_type=g5.xlarge&zone=eu-west-1b"
    assert owner_api.get(f"/api/v1/economics?{query}").json()["mtbi_hours"]  # no interruption yet: 400
    signed_post(APIClient(), "aws", docs.aws_warning(instance_id="i-0m"))
    body = owner_api.get(f"/api/v1/economics?{query}").json()
    assert body["inputs"]["mtbi_hours"] == pytest.approx(40.0)
    assert "40.0 spot node-hours / 1 interruptions" in body["inputs"]["mtbi_source"]
    assert body["optimal_interval_hours"] == pytest.approx(math.sqrt(2 * 0.05 * 40))


@pytest.mark.django_db
def test_economics_page_shows_results_inputs_and_the_curve(client, owner):
    client.force_login(owner)
    empty = client.get("/insights/economics/")
    assert empty.status_code == 200 and b"<svg" not in empty.content
    page = client.get(f"/insights/economics/?{QUERY}").content.decode()
    assert "112.36 h" in page and "T_opt" in page and "<polyline" in page and "(the optimum)" in page
    stuck = client.get(f"/insights/economics/?{QUERY.replace('restart_hours=0.1', 'restart_hours=20')}").content.decode()
    assert "No net progress." in stuck and "R is the term to fix" in stuck
    invalid = client.get(f"/insights/economics/?{QUERY.replace('discount=0.7', 'discount=-1')}")
    assert invalid.status_code == 200 and b"errorlist" in invalid.content and b"<polyline" not in invalid.content
