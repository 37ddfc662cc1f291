#!/bin/bash
echo helper
