"""Hugging Face checkpoints: conversion and import."""
