from django.urls import path

from preemption import views

urlpatterns = [
    path("", views.insights, name="insights"),
    path("economics/", views.economics_page, name="spot-economics"),
]
